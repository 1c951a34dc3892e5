"""Draw the graph behind a small loss: `python examples/draw_graph.py [FOLDER]`.

The graph is the one `python -m microtensor.demo` walks through: two tokens of three numbers
through a Linear layer, LayerNorm and cross-entropy. Writes FOLDER/tiny_graph.dot (Graphviz's text,
from `microtensor.debug.to_dot`) and, where Graphviz's `dot` program is installed, FOLDER/tiny_graph.svg.
The default FOLDER is docs/images, where the docs show the picture.
"""
import sys
from pathlib import Path

from microtensor import debug
from microtensor.demo import tiny_graph


def main(folder):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    x, logits, targets, loss, names = tiny_graph()
    (folder / "tiny_graph.dot").write_text(debug.to_dot(loss, names=names))
    print(f"wrote {folder / 'tiny_graph.dot'}")
    try:
        print(f"wrote {debug.render(loss, folder / 'tiny_graph.svg', names=names)}")
    except debug.GraphvizMissing as missing:
        print(missing)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "docs" / "images")
