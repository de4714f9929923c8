"""Named presets: plain dicts of the TrainConfig fields they set; everything else keeps the dataclass default."""

# Presets are plain dicts of the fields they set; everything else keeps the dataclass default.
_TINY_MODEL = dict(
    block_out_channels=(32, 64, 64),
    layers_per_block=1,
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=8,  # UNet2DModel's default, as the benchmark protocol's model
    dropout=0.0,
    # PROTOCOL.md v4: 4-8 channels per GroupNorm group, as ddpm-cifar10 (128 / 32). The default 32 groups put one
    # channel in each group at the first level and in the output head (protocol v1-v3): a long colour-blob phase
    # the users' model does not have (docs/adaptive.md).
    norm_num_groups=8,
)
# ddpm-cifar10's topology at a quarter of its width (PROTOCOL.md v4, "Toward the users' model").
_SMALL_MODEL = dict(
    block_out_channels=(32, 64, 64, 64),
    layers_per_block=2,
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=None,
    dropout=0.1,
    norm_num_groups=8,
)
_TINY_TRAINING = dict(
    learning_rate=2e-3,
    lr_scheduler="constant_with_warmup",
    lr_warmup_steps=200,
    adam_weight_decay=0.0,
    max_grad_norm=1.0,
    train_batch_size=128,
    mixed_precision="bf16",
    ema_max_decay=0.995,
    ema_warmup="ratio",
    max_train_steps=2000,
    ddpm_num_inference_steps=50,
    save_images_steps=500,
    num_grid_images=64,
    checkpointing_steps=500,
    logging_steps=25,
    eval_num_images=1000,
    eval_inference_steps=50,
    eval_ref_num_images=10_000,
)

PRESETS: dict[str, dict] = {
    # Ho et al. 2020, CIFAR-10: 35.7M U-Net, 800k steps of batch 128 (per device here), FID 3.17.
    "ddpm-cifar10": dict(
        resolution=32,
        block_out_channels=(128, 256, 256, 256),
        layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=None,
        dropout=0.1,
        learning_rate=2e-4,
        lr_warmup_steps=5000,
        train_batch_size=128,
        max_train_steps=800_000,
        ema_max_decay=0.9999,
        ema_warmup="power",
    ),
    # ~1.1M-parameter U-Net at 32 px, for CPU work.
    "cpu-tiny": dict(resolution=32, **_TINY_MODEL, **_TINY_TRAINING),
    # Exactly the model and training settings of shared/benchmark/PROTOCOL.md (16 px CIFAR-10).
    "cpu-tiny16": dict(resolution=16, **_TINY_MODEL, **_TINY_TRAINING),
    # ddpm-cifar10 at a quarter width (~2.2M parameters), 32 px, with the CPU presets' training settings.
    "cpu-small": dict(resolution=32, **_SMALL_MODEL, **_TINY_TRAINING),
}
