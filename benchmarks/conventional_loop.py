"""The conventional training loop, as Diffusers' examples/unconditional_image_generation/train_unconditional.py
writes it, on the same model, batch and data as ours - the reference of benchmarks/throughput.py.

What makes it conventional (all on purpose, from the example): a torch DataLoader over PIL images with per-sample
torchvision transforms (Resize, CenterCrop, RandomHorizontalFlip, ToTensor, Normalize), the example's default of 0
loader workers, `torch.randint` timesteps, `noise_scheduler.add_noise`, Diffusers' EMAModel, `.item()` logging every
step, fp32 (the example's default; `mixed_precision="bf16"` is the example run with `--mixed_precision bf16`),
Diffusers' default attention processor.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import torch
import torch.nn.functional as F

from adaptive.model import build_unet
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's


class PILImages(torch.utils.data.Dataset):
    """Undecoded images (a folder or a .zip of them), decoded with PIL and transformed per sample, per epoch."""

    def __init__(self, source: Path, resolution: int):
        from torchvision import transforms

        self.source = Path(source)
        if self.source.is_dir():
            self.items = sorted(p for p in self.source.rglob("*") if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        else:
            with zipfile.ZipFile(self.source) as z:
                self.items = sorted(n for n in z.namelist() if n.lower().endswith((".png", ".jpg", ".jpeg")))
        self._zip = None
        self.transform = transforms.Compose([
            transforms.Resize(resolution, interpolation=transforms.InterpolationMode.BILINEAR),
            transforms.CenterCrop(resolution),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize([0.5], [0.5]),
        ])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image

        if self.source.is_dir():
            img = Image.open(self.items[i])
        else:
            if self._zip is None:
                self._zip = zipfile.ZipFile(self.source)
            img = Image.open(io.BytesIO(self._zip.read(self.items[i])))
        return {"input": self.transform(img.convert("RGB"))}


class ConventionalLoop:
    """One object per measurement: `step()` runs one optimizer step exactly like the example's loop body."""

    def __init__(self, cfg, source: Path, num_workers: int = 0, mixed_precision: str = "no"):
        from accelerate import Accelerator
        from diffusers import DDPMScheduler, UNet2DModel
        from diffusers.optimization import get_scheduler
        from diffusers.training_utils import EMAModel

        self.accelerator = Accelerator(mixed_precision=mixed_precision, gradient_accumulation_steps=1)
        # as the example
        self.weight_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mixed_precision, torch.float32)
        model = build_unet(cfg)  # same architecture; Diffusers' default attention processor
        self.noise_scheduler = DDPMScheduler(num_train_timesteps=cfg.ddpm_num_steps,
                                             beta_schedule=cfg.ddpm_beta_schedule)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                      weight_decay=cfg.adam_weight_decay, eps=cfg.adam_epsilon)
        loader = torch.utils.data.DataLoader(PILImages(source, cfg.resolution), batch_size=cfg.train_batch_size,
                                             shuffle=True, num_workers=num_workers, drop_last=True)
        lr_scheduler = get_scheduler("constant_with_warmup", optimizer=optimizer, num_warmup_steps=cfg.lr_warmup_steps,
                                     num_training_steps=10**9)
        self.model, self.optimizer, self.loader, self.lr_scheduler = self.accelerator.prepare(
            model, optimizer, loader, lr_scheduler)
        self.ema_model = EMAModel(model.parameters(), decay=cfg.ema_max_decay, use_ema_warmup=True,
                                  inv_gamma=cfg.ema_inv_gamma, power=cfg.ema_power, model_cls=UNet2DModel,
                                  model_config=model.config)
        self.ema_model.to(self.accelerator.device)
        self.iterator = iter(self.loader)
        self.global_step = 0
        self.logs = {}

    def step(self) -> None:
        try:
            batch = next(self.iterator)
        except StopIteration:
            self.iterator = iter(self.loader)
            batch = next(self.iterator)
        clean_images = batch["input"].to(self.weight_dtype)
        noise = torch.randn(clean_images.shape, dtype=clean_images.dtype, device=clean_images.device)
        bsz = clean_images.shape[0]
        timesteps = torch.randint(0, self.noise_scheduler.config.num_train_timesteps, (bsz,),
                                  device=clean_images.device).long()
        noisy_images = self.noise_scheduler.add_noise(clean_images, noise, timesteps)
        with self.accelerator.accumulate(self.model):
            model_output = self.model(noisy_images, timesteps).sample
            loss = F.mse_loss(model_output.float(), noise.float())
            self.accelerator.backward(loss)
            if self.accelerator.sync_gradients:
                self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.lr_scheduler.step()
            self.optimizer.zero_grad()
        if self.accelerator.sync_gradients:
            self.ema_model.step(self.model.parameters())
            self.global_step += 1
        self.logs = {"loss": loss.detach().item(), "lr": self.lr_scheduler.get_last_lr()[0], "step": self.global_step,
                     "ema_decay": self.ema_model.cur_decay_value}
