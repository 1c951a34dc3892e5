"""Speed never at the cost of the math: train the default recipe for 2000 steps on tinyshakespeare
and report the final validation loss (target <= 1.90) and the training tokens/s.

The data default is ../shared/data/tinyshakespeare.txt beside the project when it is there;
--data takes any text file (or 'shakespeare' for the corpus train.py fetches).
"""
import tempfile
from pathlib import Path

from harness import TINYSHAKESPEARE

import train


def options(p):
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="text to train on")
    p.add_argument("--max-iters", type=int, default=2000, help="training steps")


def measure(args, machine):
    with tempfile.TemporaryDirectory() as out_dir:
        train_args = train.build_parser().parse_args(
            ["--data", args.data, "--max-iters", str(args.max_iters), "--out-dir", out_dir, "--sample-chars", "0"]
        )
        results = train.train(train_args)
    summary = {key: results[key] for key in ("steps", "final_train_loss", "final_val_loss", "tokens_per_s", "train_time_s", "wall_time_s")}
    summary["data"] = Path(args.data).name
    return {"machine": machine, "convergence": summary}


def result_rows(data):
    c = data["convergence"]
    data_name = Path(c.get("data", "tinyshakespeare.txt")).name
    return [f"| val loss after {c['steps']} steps on {data_name} | {c['final_val_loss']:.4f} | | | | ≤ 1.90 |"]
