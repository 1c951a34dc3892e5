"""A short tour of microtensor: `python -m microtensor.demo`.

Builds a two-layer network from ops with hand-written backward functions, fits it to a toy
problem, and checks one op's gradient against finite differences.
"""
import numpy as np
from rich.console import Console
from rich.table import Table

import microtensor as mt
import microtensor.functional as F


def main():
    console = Console()
    mt.manual_seed(0)
    # Toy data: classify points in the plane by which quadrant they fall in.
    points = mt.randn(256, 2)
    labels = mt.tensor((points.numpy()[:, 0] > 0).astype(np.int64) * 2 + (points.numpy()[:, 1] > 0))
    w1, w2 = mt.nn.Linear(2, 32), mt.nn.Linear(32, 4)
    optimizer = mt.optim.AdamW(list(w1.parameters()) + list(w2.parameters()), lr=0.05, weight_decay=0.0)
    table = Table(title="a 2-32-4 MLP learns the quadrants")
    table.add_column("step", justify="right")
    table.add_column("loss", justify="right")
    table.add_column("accuracy", justify="right")
    for step in range(201):
        logits = w2(F.gelu(w1(points)))  # (256, 4)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            accuracy = (logits.numpy().argmax(axis=1) == labels.numpy()).mean()
            table.add_row(str(step), f"{loss.item():.4f}", f"{accuracy:.1%}")
    console.print(table)

    x = mt.randn(3, 5, dtype=mt.float64, requires_grad=True)
    ok = mt.gradcheck(lambda x: F.layer_norm(F.softmax(x, dim=-1), eps=1e-5), [x])
    console.print(f"gradcheck of layer_norm(softmax(x)) against finite differences: {'passed' if ok else 'FAILED'}")


if __name__ == "__main__":
    main()
