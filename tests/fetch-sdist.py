#!/usr/bin/env python3
"""Download one source distribution from PyPI and check its sha256.

    fetch-sdist.py PACKAGE VERSION SHA256 OUT

Uses PyPI's simple JSON API (PEP 691), the one pip uses. Exit status 1 with one line on failure.
"""

import hashlib
import json
import sys
import urllib.request


def main() -> int:
    package, version, sha256, out = sys.argv[1:5]
    filename = f"{package.replace('-', '_')}-{version}.tar.gz"
    request = urllib.request.Request(
        f"https://pypi.org/simple/{package}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request) as response:
        files = json.load(response)["files"]
    entry = next((f for f in files if f["filename"] == filename), None)
    if entry is None:
        print(f"fetch-sdist: {filename} is not on PyPI", file=sys.stderr)
        return 1
    digest = hashlib.sha256()
    with urllib.request.urlopen(entry["url"]) as response, open(out, "wb") as f:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            f.write(chunk)
    if digest.hexdigest() != sha256:
        print(f"fetch-sdist: {filename} has sha256 {digest.hexdigest()}, expected {sha256}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
