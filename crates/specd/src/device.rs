//! `--device` and `--dtype` flags.

use anyhow::{bail, Result};
use candle_core::{DType, Device};
use clap::ValueEnum;

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
