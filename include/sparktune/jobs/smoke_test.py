"""The smoke-test job: loads ``models:/NAME@staging`` the way a user would and predicts with it;
what ``SmokeTestOperator`` runs.

    python -m sparktune.jobs.smoke_test --model-uri models:/NAME@staging --dataset-path D --output s.json

Exit codes as for every sparktune job: 0 done, 2 bad input or a model that answers no label, 1
anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from sparktune.core.model_safety import UnsafeModelError
from sparktune.model.process_setup import configure_process_logging
from sparktune.release.eval_inputs import EvaluationInputError
from sparktune.release.smoke import DEFAULT_ROWS, SmokeTestFailed, smoke_test

logger = logging.getLogger("sparktune.jobs.smoke_test")


def main(argv: list[str] | None = None) -> int:
    configure_process_logging()
    parser = argparse.ArgumentParser(
        prog="python -m sparktune.jobs.smoke_test",
        description="Load a registered model as a user would and predict with it.",
    )
    parser.add_argument("--model-uri", required=True, help="models:/NAME@staging, the way users load it")
    parser.add_argument(
        "--dataset-path", required=True, help="The materialized dataset (or prepared Parquet)"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument(
        "--max-invalid-rate", type=float, default=0.0, help="Share of rows that may answer no label"
    )
    parser.add_argument("--output", required=True, help="Where to write the result JSON")
    parser.add_argument(
        "--trust-remote-code",
        choices=("true", "false"),
        default="false",
        help="Let a model that ships its own Python code (auto_map) load; default false: refused.",
    )
    args = parser.parse_args(argv)
    try:
        result = smoke_test(
            args.model_uri,
            args.dataset_path,
            split=args.split,
            rows=args.rows,
            max_invalid_rate=args.max_invalid_rate,
            trust_remote_code=args.trust_remote_code == "true",
        )
    except (EvaluationInputError, SmokeTestFailed, UnsafeModelError) as err:
        logger.error("%s", err)
        return 2
    except Exception:
        logger.exception("Smoke test failed")
        return 1
    Path(args.output).write_text(json.dumps(result.to_dict(), indent=2))
    if not result.passed:
        shown = "; ".join(f"{text[-60:]!r} -> {answer[:60]!r}" for text, answer in result.bad_answers)
        logger.error(
            "%s answered outside the label set %s on %d of %d rows, e.g. %s. The model loads but does not "
            "answer with labels: it stays out of champion; check its training (loss, gate metrics).",
            args.model_uri,
            result.labels,
            result.n_bad,
            result.rows,
            shown,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
