//! Test double of the CUDA launchers (feature `cuda-mock`): being written.
