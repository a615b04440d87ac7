"""The click commands, console rendering and scaffolding."""
