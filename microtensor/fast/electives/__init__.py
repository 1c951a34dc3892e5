"""The fast twins of the techniques' ops (microtensor/ops/electives/), registered like those above."""
