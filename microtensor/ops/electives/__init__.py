"""The ops of the techniques, one file each, written like the ops above them: the default GPT runs
none of these (RMSNorm, SiLU and SwiGLU, RoPE, online attention, mixture of experts, LoRA,
quantization, gradient checkpointing, 16-bit training, DPO's loss, the selective scan of a
state-space model); a model option or a class exercise does. `microtensor.functional` gathers them too."""
