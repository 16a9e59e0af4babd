"""``tensors.address_view``: results written through it land in the tensor, whose storage stays resizable."""

from __future__ import annotations

import numpy as np
import pytest

from hfreduce.reduction import DType
from hfreduce.tensors import address_view

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("dtype", "kind"), [("float32", DType.F32), ("float16", DType.F16), ("bfloat16", DType.BF16)])
def test_writes_land_in_the_tensor_and_its_storage_can_still_be_freed(dtype: str, kind: DType) -> None:
    t = torch.zeros(6, dtype=getattr(torch, dtype))
    flat = address_view(t)
    assert flat.dtype is kind and len(flat.array) == 6 and flat.data_ptr == t.data_ptr()
    src = torch.tensor([1.0, 2.0], dtype=t.dtype)
    flat.array[2:4] = src.view(torch.int16).numpy().view(kind.storage) if kind.itemsize == 2 else src.numpy()
    assert t.tolist() == [0.0, 0.0, 1.0, 2.0, 0.0, 0.0]
    t.untyped_storage().resize_(0)  # .numpy() would have made this raise: "storage that is not resizable"
    assert t.untyped_storage().nbytes() == 0


def test_an_empty_tensor_and_a_numpy_array_are_viewed_too() -> None:
    assert len(address_view(torch.empty(0)).array) == 0
    arr = np.zeros(3, dtype=np.float32)
    address_view(arr).array[1] = 5.0
    assert arr.tolist() == [0.0, 5.0, 0.0]


@pytest.mark.parametrize(
    "buf",
    [torch.zeros(4, 4).t(), torch.zeros(3, dtype=torch.int64), np.zeros(4, dtype=np.float32)[::2]],
    ids=["non-contiguous", "int64", "numpy-strided"],
)
def test_what_cannot_be_written_in_place_is_refused(buf: object) -> None:
    with pytest.raises(TypeError, match="out must be a contiguous"):
        address_view(buf)
