"""Reference for tests/train/amp.cpp: torch.amp.GradScaler on a device (cpu, or cuda for the GPU
test), the same tiny model and steps as the C++ test, with inf injected into the loss at chosen
steps. Arguments: steps growth_interval inject(comma list) [device]. Prints one line per step
("step <k> <scale after update> <skipped 0/1>") and the final parameters ("param <values...>")."""
import sys

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
steps, growth_interval = int(sys.argv[1]), int(sys.argv[2])
inject = {int(k) for k in sys.argv[3].split(",") if k}
device = sys.argv[4] if len(sys.argv) > 4 else "cpu"

model = torch.nn.Linear(4, 3)
with torch.no_grad():
    model.weight.copy_(torch.linspace(-0.5, 0.5, 12).reshape(3, 4))
    model.bias.copy_(torch.linspace(-0.1, 0.1, 3))
model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler(device, init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                              growth_interval=growth_interval)
for k in range(steps):
    x = torch.sin(torch.arange(32, dtype=torch.float32).reshape(8, 4) * 0.37 + k).to(device)
    y = ((torch.arange(8) + k) % 3).to(device)
    with torch.autocast(device, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
        if k in inject:
            loss = loss * float("inf")
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    skipped = sum(v.item() for v in scaler._found_inf_per_device(opt).values()) > 0
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    print(f"step {k} {scaler.get_scale():.9g} {int(skipped)}")
for p in model.parameters():
    print("param " + " ".join(f"{v:.9g}" for v in p.detach().flatten().tolist()))
