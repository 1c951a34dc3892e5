"""Speed never at the cost of the math: train the default recipe for 2000 steps on tinyshakespeare
and report the final validation loss (target <= 1.90) and the training tokens/s.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_convergence.py [--data FILE] [--json FILE]

The data default is ../shared/data/tinyshakespeare.txt beside the project when it is there;
--data takes any text file (or 'shakespeare' for the corpus train.py fetches).
"""
from common import TINYSHAKESPEARE, console, machine_info, parser, print_machine, write_json  # isort: skip  (before models: it puts the checkout on sys.path, and tunes the process)
import tempfile
from pathlib import Path

from rich.table import Table

import train



def main():
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--data", default=str(TINYSHAKESPEARE), help="text to train on")
    p.add_argument("--max-iters", type=int, default=2000, help="training steps")
    args = p.parse_args()
    info = machine_info()
    print_machine(info)
    with tempfile.TemporaryDirectory() as out_dir:
        train_args = train.build_parser().parse_args(
            ["--data", args.data, "--max-iters", str(args.max_iters), "--out-dir", out_dir, "--sample-chars", "0"]
        )
        results = train.train(train_args)
    summary = {key: results[key] for key in ("steps", "final_train_loss", "final_val_loss", "tokens_per_s", "train_time_s", "wall_time_s")}
    summary["data"] = Path(args.data).name
    table = Table(title=f"default recipe, {summary['steps']} steps on {args.data}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("final val loss", f"{summary['final_val_loss']:.4f}", "≤ 1.90")
    table.add_row("final train loss", f"{summary['final_train_loss']:.4f}", "")
    table.add_row("training tokens/s (steps only)", f"{summary['tokens_per_s']:,.0f}", "")
    table.add_row("wall time", f"{summary['wall_time_s']:.1f} s", "")
    console.print(table)
    write_json(args.json, {"machine": info, "convergence": summary})


if __name__ == "__main__":
    main()
