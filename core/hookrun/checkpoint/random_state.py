"""The random generators' states (Python, numpy, torch CPU and CUDA) as a checkpoint holds
them: tensors and plain types only, so a ``weights_only`` load restores them.
"""

from __future__ import annotations

import random
from typing import Any

import torch


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU and CUDA) generator states as tensors and plain types."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    try:
        import numpy as np
    except ImportError:
        return state
    kind, key, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state["numpy"] = {
        "kind": str(kind),
        "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
    if "numpy" in state:
        import numpy as np

        npst = state["numpy"]
        key = npst["key"].numpy().astype("uint32")
        np.random.set_state(
            (npst["kind"], key, npst["pos"], npst["has_gauss"], npst["cached_gaussian"])
        )
