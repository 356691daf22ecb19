"""``python -m nfsrdma.conform.gendoc [docs/conform.md]``: rewrite the list of checks in the
document (between its markers) from the code; ``--check`` only says whether it is current."""

from __future__ import annotations

import sys
from pathlib import Path

from nfsrdma.conform.registry import all_checks
from nfsrdma.conform.report import MARKDOWN_BEGIN, MARKDOWN_END, markdown


def regenerate(text: str) -> str:
    start = text.index(MARKDOWN_BEGIN)
    end = text.index(MARKDOWN_END) + len(MARKDOWN_END) + 1
    return text[:start] + markdown(all_checks()) + text[end:]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"] or ["docs/conform.md"]
    path = Path(paths[0])
    text = path.read_text()
    new = regenerate(text)
    if check:
        if new != text:
            print(f"{path} is not current: python -m nfsrdma.conform.gendoc", file=sys.stderr)
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
