"""The config file, its models and schema, the Runner's arguments, optimizers, schedules
and tasks."""
