from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

def sum_into(
    out: npt.NDArray[np.float32],
    sources: Sequence[npt.NDArray[np.float32]],
    copies: Sequence[npt.NDArray[np.float32]],
    divisor: float,
    /,
) -> None: ...
