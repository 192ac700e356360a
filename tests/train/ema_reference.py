"""Reference for tests/train/ema.cpp: the exponential moving average of a model's weights as
Ultralytics' ModelEMA and timm's ModelEmaV2 compute it, written here from their published update
rules (no dependency on either package):
  ultralytics  d = decay * (1 - exp(-updates / tau)), updates counted from 1 at the first update;
               every floating-point entry of the state dict (parameters and buffers):
               v = v * d + (1 - d) * model_v; other entries are left as they were
  timm         d = decay; every entry: v = d * v + (1 - d) * model_v (copied back into v's dtype)
The EMA starts as a deep copy of the model before training. The model is the C++ test's
Sequential(Linear(3, 4), BatchNorm1d(4), Linear(4, 2)) in float64; its state before training is
<dir>/step0.txt and after optimizer step k <dir>/step<k>.txt, one line per entry, "<name> <values...>".
An update runs after every `every`-th step. Prints the final EMA's floating-point entries of each
run given, one line each, "<run> <name> <values...>" with 17 significant digits (run: 0, 1, ...).

usage: ema_reference.py <steps> <dir>,<rule: ultralytics|timm>,<decay>,<tau>,<every> ..."""
import copy
import math
import sys

import torch

torch.set_num_threads(1)


def model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)).double()


def load(m, path):
    state = m.state_dict()
    with open(path) as f:
        for line in f:
            name, *values = line.split()
            t = state[name]
            with torch.no_grad():
                t.copy_(torch.tensor([float(v) for v in values], dtype=torch.float64).reshape(t.shape))
    return m


class UltralyticsEma:
    def __init__(self, m, decay, tau):
        self.ema = copy.deepcopy(m).eval()
        self.updates = 0
        self.decay = lambda x: decay * (1 - math.exp(-x / tau))

    def update(self, m):
        with torch.no_grad():
            self.updates += 1
            d = self.decay(self.updates)
            msd = m.state_dict()
            for k, v in self.ema.state_dict().items():
                if v.dtype.is_floating_point:
                    v *= d
                    v += (1 - d) * msd[k].detach()


class TimmEmaV2:
    def __init__(self, m, decay):
        self.module = copy.deepcopy(m).eval()
        self.decay = decay

    def update(self, m):
        with torch.no_grad():
            for ema_v, model_v in zip(self.module.state_dict().values(), m.state_dict().values()):
                ema_v.copy_(self.decay * ema_v + (1.0 - self.decay) * model_v)


def main():
    steps = int(sys.argv[1])
    for run, arg in enumerate(sys.argv[2:]):
        directory, rule, decay, tau, every = arg.split(",")
        decay, tau, every = float(decay), float(tau), int(every)
        m = load(model(), f"{directory}/step0.txt")
        ema = UltralyticsEma(m, decay, tau) if rule == "ultralytics" else TimmEmaV2(m, decay)
        for k in range(1, steps + 1):
            load(m, f"{directory}/step{k}.txt")
            if k % every == 0:
                ema.update(m)
        averaged = ema.ema if rule == "ultralytics" else ema.module
        for name, v in averaged.state_dict().items():
            if v.dtype.is_floating_point:
                print(f"{run} {name} " + " ".join(f"{x:.17g}" for x in v.flatten().tolist()))


main()
