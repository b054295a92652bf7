//! burn-interop-checker built against burn 0.22.1: what it prints is in `checker.rs`, shared with
//! the burn 0.23.0-pre.1 checker in `../checker-0.23`.

mod checker;

use std::process::ExitCode;

use burn_core::tensor::TensorData;
use burn_store::bridge;
use burn_store::burn_pack::Tensor as PackTensor;

/// burn-store 0.22.1's `BurnpackStore` hands out burn-pack's own tensors.
impl checker::Stored for PackTensor {
    fn dims(&self) -> Vec<usize> {
        self.shape.to_vec()
    }

    fn data(&self) -> Result<TensorData, String> {
        bridge::to_data(self).map_err(|e| e.to_string())
    }
}

fn main() -> ExitCode {
    checker::run("0.22.1")
}
