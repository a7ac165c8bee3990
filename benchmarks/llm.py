"""The structural-search table with an LLM editor: ``llm`` + ``cmaes`` beside ``cmaes`` and ``mutate`` + ``cmaes``.

Usage: python benchmarks/llm.py --base-url URL --model NAME [--api-key-env VAR] [--tasks ...] [--seeds 0,1,2] [--write]
Needs an OpenAI-compatible endpoint (see docs/how-to/refiners/llm.md); not measured on the machine that wrote
ratchet, which has no model. Writes the section "Structural search with an LLM" of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse

import structural


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="API root, e.g. http://localhost:11434/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key-env", default=None, help="Name of the environment variable holding the key.")
    ap.add_argument("--budget-requests", type=int, default=200, help="Most requests per run.")
    args, _ = ap.parse_known_args()
    llm = {"kind": "llm", "base_url": args.base_url, "model": args.model, "budget_requests": args.budget_requests,
           **({"api_key_env": args.api_key_env} if args.api_key_env else {})}
    structural.main({"llm+cmaes": [llm, structural.CMAES]}, section="Structural search with an LLM")


if __name__ == "__main__":
    main()
