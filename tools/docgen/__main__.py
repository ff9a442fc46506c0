"""``python -m tools.docgen [--check]``: write the generated pages, or check them."""

from __future__ import annotations

import argparse
import sys

from tools.docgen import stale_pages, write_pages


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docgen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a page is out of date")
    args = parser.parse_args()
    if args.check:
        stale = stale_pages()
        for name in stale:
            print(f"docs/{name} is out of date: run `python -m tools.docgen`", file=sys.stderr)
        return 1 if stale else 0
    for name in write_pages():
        print(f"wrote docs/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
