// Builds the CUDA kernels under the `cuda` feature (owned by cuda/ work); nothing otherwise.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "cuda")]
    cuda_build::build();
}

#[cfg(feature = "cuda")]
mod cuda_build {
    pub fn build() {
        println!("cargo:rerun-if-changed=cuda");
        // filled in by the CUDA work
    }
}
