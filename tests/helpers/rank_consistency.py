"""Run under 2 gloo ranks: samplers updated from gathered losses hold identical state; gather order is the draw
order."""


import torch
from accelerate import Accelerator

from adaptive.config import PRESETS, TrainConfig
from adaptive.data import Layout
from adaptive.losses import DiffusionTables
from adaptive.loop import gather_global_batch
from adaptive.model import build_noise_scheduler
from adaptive.timesteps import METHODS, build_sampler
from adaptive.timesteps.base import DrawRequest

acc = Accelerator(cpu=True)
rank, world = acc.process_index, acc.num_processes
assert world == 2, world
layout = Layout(batch_size=8, world_size=world, accum=2)
# every registered method that draws one global batch (kim2025 draws each image's t from its x0, on its own rank)
for name in [n for n, cls in METHODS.items() if "batch" not in cls.needs]:
    cfg = TrainConfig.from_dict({**PRESETS["cpu-tiny16"], "timestep_sampler": name,
                                 **({"adaptive_warmup_steps": 2} if name == "adaptive" else {})})
    tables = DiffusionTables.build(build_noise_scheduler(cfg).alphas_cumprod, cfg, "cpu")
    sampler = build_sampler(cfg, "cpu", tables)
    noise = torch.Generator().manual_seed(100 + rank)  # every rank sees different losses
    for step in range(30):
        everything = slice(0, layout.global_batch)  # the whole global draw, as every rank's rows come from it
        request = DrawRequest(layout.global_batch, (everything,), torch.Generator().manual_seed(step), fraction=0.0)
        t_all = sampler.draw(request).t
        local_t, local_loss = [], []
        for micro in range(layout.accum):
            t = t_all[layout.slice(micro, rank)]
            local_t.append(t)
            local_loss.append(t.float() / 1000 + 0.01 * torch.rand(t.shape, generator=noise))
        t_g, loss_g = gather_global_batch(acc, layout, torch.cat(local_t), torch.cat(local_loss))
        assert torch.equal(t_g, t_all)
        assert torch.allclose(loss_g - t_all.float() / 1000, torch.zeros(()), atol=0.0101)  # same order as the draw
        sampler.observe(t_g, loss_g)
    flat = torch.cat([v.flatten().float() for v in sampler.state_dict().values() if isinstance(v, torch.Tensor)]
                     or [torch.zeros(0)])  # a stateless method (uniform, speed): its draws were compared above
    everyone = acc.gather(flat[None])
    assert torch.equal(everyone[0], everyone[1]), name
    print(f"rank {rank}: {name} state identical across ranks ({flat.numel()} values)")
acc.wait_for_everyone()
print(f"rank {rank}: OK")
acc.end_training()  # tear the gloo group down before the interpreter exits (an exit with it alive can abort)
