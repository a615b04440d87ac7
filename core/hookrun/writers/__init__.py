"""Where scalars, images and the run's config go: the ``Writer`` interface and built-ins.

More writers come from the ``hookrun.writers`` entry-point group; built-ins are declared
there too, so third-party writers are found exactly the same way. The built-ins' entry points
name their classes here.

- ``base``: the ``Writer`` interface, how a run ended, images as uint8
- ``jsonl``, ``tensorboard``: the built-in writers
- ``tracker``: ``TrackerWriter``, the base of tracker writers (their shared options and
  checks), and which checkpoint files they upload
- ``registry``: writer classes found from a ``writers:`` spec, and the spec's problems
- ``lifecycle``: a run's writers opened, their states saved and restored, closed
"""

from hookrun.writers.base import Writer
from hookrun.writers.jsonl import JsonlWriter
from hookrun.writers.tensorboard import TensorBoardWriter
from hookrun.writers.tracker import TrackerWriter

__all__ = ["JsonlWriter", "TensorBoardWriter", "TrackerWriter", "Writer"]
