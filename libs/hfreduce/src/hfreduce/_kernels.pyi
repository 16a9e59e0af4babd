from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

def sum_into(out: F32, sources: Sequence[F32], copies: Sequence[F32], divisor: float, /) -> None: ...
