from __future__ import annotations

import pytest

from hf3fs import uri


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("/a/b", "/a/b"),
        ("hf3fs:/a/b", "/a/b"),
        ("hf3fs:///a/b/", "/a/b"),
        ("hf3fs://a/b", "/a/b"),
        ("3fs:/a//b/../c", "/a/c"),
        ("hf3fs:/", "/"),
        ("//x", "/x"),
    ],
)
def test_strip_scheme(text: str, path: str) -> None:
    assert uri.strip_scheme(text) == path


@pytest.mark.parametrize("text", ["a/b", "", "hf3fs:a", "3fs:"])
def test_relative_paths_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="absolute"):
        uri.strip_scheme(text)


def test_has_scheme_and_url() -> None:
    assert uri.has_scheme("hf3fs:/x") and uri.has_scheme("3fs:/x")
    assert not uri.has_scheme("/x") and not uri.has_scheme("./hf3fs:/x")
    assert uri.to_url("/d/x.parquet") == "hf3fs:///d/x.parquet"
