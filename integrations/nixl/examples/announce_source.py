"""Tells the node's railguard agent that this process serves KV blocks as a source, under the
name its transfers' other ends will give it (the NIXL agent name; ``<engine>|tp<r>pp<p>`` for
one vLLM worker, which the vLLM connector announces by itself).

The agent attributes the GPU the process holds and the NIC its transfers use, tells the
collector, and answers with that attribution (printed as JSON). Destinations whose transfers
from this source arrive wrong are then pinned on this GPU/NIC pair by name, attested by this
node. The process must hold the GPU's device file (a CUDA process does).

    python announce_source.py --worker prefill-7 --device 0 [--socket /run/railguard/inline.sock]

Exit status: 0 attested; 1 the agent refused or did not answer (why, on stderr).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from railguard_nixl import Reporter  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True, help="the name destinations' failures give this source")
    ap.add_argument("--device", type=int, default=0, help="the CUDA device ordinal it serves blocks from")
    ap.add_argument("--socket", default=None, help="the agent's in-line socket (RAILGUARD_INLINE_SOCKET)")
    args = ap.parse_args()
    r = Reporter(args.socket)
    attested = r.announce(args.worker, args.device)
    r.close(0.1)
    if attested is None:
        print(f"not attested: {r.last_error or 'no answer'}", file=sys.stderr)
        return 1
    print(json.dumps(attested))
    return 0


if __name__ == "__main__":
    sys.exit(main())
