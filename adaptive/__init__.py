"""adaptive-diffusion: fast DDPM training on Diffusers + Accelerate with adaptive timestep sampling."""

__version__ = "0.1.0"
