"""`embedcli ARGS` that SIGKILLs itself at a named step: `cli_child.py WHEN:MODULE:ATTR:N ARGS...` (see
`tests.stores.store_child.arm`)."""

from __future__ import annotations

import sys

from tests.stores.store_child import arm

if __name__ == "__main__":
    arm(sys.argv[1])
    sys.argv = ["embedcli", *sys.argv[2:]]
    from embedcli.cli import main

    main()
