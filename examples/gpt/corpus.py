"""A deterministic text corpus for the tiny GPT: sentences from a small grammar, the same bytes for the same seed.

    python examples/gpt/corpus.py corpus.txt --mib 4            # a local file
    python examples/gpt/corpus.py hf3fs:///data/corpus.txt      # into 3FS (FF_MGMTD_ADDRESSES, FF_TOKEN)

The text has structure a small model learns in a few hundred steps (agreement, counting, recurring phrases),
so its loss falls well below that of random bytes (ln 256 = 5.55).
"""

from __future__ import annotations

import argparse
import random
import sys

import fsspec

SUBJECTS = ["the fox", "a heron", "the old miller", "my sister", "the engineer", "a small robot", "the river"]
VERBS = ["counts", "carries", "paints", "remembers", "follows", "measures", "builds", "forgets"]
ADJECTIVES = ["red", "quiet", "heavy", "golden", "broken", "tiny", "ancient", "bright"]
OBJECTS = ["stones", "letters", "bridges", "lanterns", "clocks", "boats", "seeds", "maps"]
PLACES = ["near the river", "on the hill", "in the market", "under the bridge", "by the mill", "at dawn"]
NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "nine"]


def sentence(rng: random.Random) -> str:
    n = rng.randrange(len(NUMBERS))
    text = (f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {NUMBERS[n]} {rng.choice(ADJECTIVES)} "
            f"{rng.choice(OBJECTS)} {rng.choice(PLACES)}")  # fmt: skip
    if rng.random() < 0.3:
        text += f", then {NUMBERS[(n + 1) % len(NUMBERS)]} more"
    return text[0].upper() + text[1:] + "."


def generate(num_bytes: int, seed: int = 0) -> bytes:
    """``num_bytes`` of text (cut at the end), the same for the same ``seed``."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < num_bytes:
        paragraph = " ".join(sentence(rng) for _ in range(rng.randint(3, 7))) + "\n"
        parts.append(paragraph)
        size += len(paragraph)
    return "".join(parts).encode()[:num_bytes]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="a local path or an hf3fs:/// URL")
    p.add_argument("--mib", type=float, default=4.0, help="size in MiB (default 4)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    data = generate(int(a.mib * (1 << 20)), a.seed)
    with fsspec.open(a.out, "wb") as f:
        f.write(data)
    print(f"{a.out}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
