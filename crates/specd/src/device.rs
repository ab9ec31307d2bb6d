//! `--device` and `--dtype` flags.

use anyhow::{bail, Result};
use candle_core::{DType, Device};
use clap::{Args, ValueEnum};

/// Where the models of a command run and in which float type: the same two flags on every
/// command that loads a model.
#[derive(Args, Debug, Clone, Copy)]
pub struct ComputeArgs {
    /// Device the models run on (`cuda` and `metal` need a build with that feature).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// Float type of the candle models' weights and activations (Gemma 4 checkpoints);
    /// GGUF models keep their quantized types.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
}

impl ComputeArgs {
    pub fn device(&self) -> Result<Device> {
        self.device.device()
    }

    pub fn dtype(&self) -> DType {
        self.dtype.dtype()
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DeviceArg {
    Cpu,
    Cuda,
    Metal,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DTypeArg {
    F32,
    Bf16,
    F16,
}

impl DeviceArg {
    pub fn device(self) -> Result<Device> {
        Ok(match self {
            Self::Cpu => Device::Cpu,
            Self::Cuda if candle_core::utils::cuda_is_available() => Device::new_cuda(0)?,
            Self::Metal if candle_core::utils::metal_is_available() => Device::new_metal(0)?,
            Self::Cuda => {
                bail!("--device cuda: this build has no CUDA support (build with --features cuda)")
            }
            Self::Metal => bail!(
                "--device metal: this build has no Metal support (build with --features metal)"
            ),
        })
    }
}

impl DTypeArg {
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
            Self::F16 => DType::F16,
        }
    }
}
