"""A short tour of autodiff: `python -m microtensor.demo`."""
import numpy as np

import microtensor as mt


def main():
    mt.manual_seed(0)
    x = mt.randn(3, 4, dtype=mt.float64, requires_grad=True)
    y = (x.exp() * x).sum(dim=1).log().mean()
    y.backward()
    print("x =", x)
    print("y = mean(log(sum(exp(x) * x, dim=1))) =", y.item())
    print("dy/dx =\n", x.grad)
    fn = lambda x: (x.exp() * x).sum(dim=1).log().mean()  # noqa: E731
    print("gradcheck against finite differences:", mt.gradcheck(fn, [mt.tensor(np.abs(x.data) + 0.1, requires_grad=True)]))


if __name__ == "__main__":
    main()
