"""Process groups, collectives, cluster environments, FSDP."""
