"""Checkpoint files and atomic I/O, what a checkpoint holds, resume fit checks, sharded
folders, export."""
