"""``python -m hookrun.testing WORK_DIR OPTIONS_JSON``: the kill-and-resume harness's
subprocess (:func:`hookrun.testing.resume_job` with JSON options)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Sequence

from hookrun.testing.harness import resume_job


def _main(argv: Sequence[str]) -> None:
    """The harness's subprocess. A ``KeyboardInterrupt`` (a re-delivered SIGINT) ends it by
    SIGINT itself: Python means to, but torch's exit hook ``dump_compile_times`` makes the
    interpreter exit 1 instead when ``tabulate`` is installed."""
    try:
        resume_job(argv[1], **json.loads(argv[2]))
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    _main(sys.argv)
