"""Default names for jobs, models, endpoints and transforms, as SageMaker makes them.

Kept apart so the estimator, the model and the transformer can all name things without
importing one another.
"""

from __future__ import annotations

import time


def timestamp() -> str:
    """SageMaker's ``sagemaker_timestamp()``: YYYY-MM-DD-HH-MM-SS-mmm."""
    now = time.time()
    ms = str(int(now * 1000) % 1000).zfill(3)
    return time.strftime(f"%Y-%m-%d-%H-%M-%S-{ms}", time.gmtime(now))


def name_from_base(base: str, max_length: int = 63, attempt: int = 0) -> str:
    """``base-<timestamp>``; ``attempt`` > 0 adds ``-<attempt>`` (the name taken by another
    submit in the same millisecond)."""
    stamp = timestamp() + (f"-{attempt}" if attempt else "")
    return f"{base[: max_length - len(stamp) - 1]}-{stamp}"
