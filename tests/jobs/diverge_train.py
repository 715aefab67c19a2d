"""A real (tiny) PyTorch training loop made to diverge: SGD at a learning rate of 1e6
(``argv[1]``) on a two-layer MLP regression. It logs one HF-Trainer-style metrics dict
per step and, like a real trainer, never checks its loss: it goes on "training" with NaN
weights until its step limit. With ``$EAGLE3_STANDIN_GPU_DIR`` set it registers its pid
there, as holding GPU memory on tests/jobs/standin_smi.py's card."""

import os
import sys
import time

import torch

lr = float(sys.argv[1]) if len(sys.argv) > 1 else 1e6
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
folder = os.environ.get("EAGLE3_STANDIN_GPU_DIR")
if folder:
    with open(os.path.join(folder, str(os.getpid())), "w") as f:
        f.write("20480")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=lr)
x = torch.randn(256, 16)
y = x.sum(dim=1, keepdim=True)
print("***** Running training *****", flush=True)
print("  Total optimization steps = %d" % steps, flush=True)
for step in range(1, steps + 1):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    opt.step()
    print({"loss": round(loss.item(), 4), "grad_norm": round(norm.item(), 4), "learning_rate": lr,
           "epoch": round(step / 100, 2)}, flush=True)
    time.sleep(0.2)
