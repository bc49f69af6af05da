//! The CUDA emulator of feature `cuda-emu` (cuda/emu) checked on its own: its collectives,
//! WMMA, cp.async (landing only at the wait) and half conversions give the right results,
//! its launch limits and stream-capture rules return the statuses a GPU returns, and what
//! it promises to catch (a divergent barrier, a warp collective with an exited lane, a
//! host pointer passed to a kernel, directly or as a view's `data`, unless inside a range
//! given to `cudaHostRegister` or while `kveEmuHostMemoryAsDevice(1)` holds, a write past an
//! allocation) is caught. Builds cuda/emu/selftest.cpp with the host C++ compiler and
//! runs one case per process.
#![cfg(feature = "cuda-emu")]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

fn selftest() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let exe = dir.join("cuda_emu_selftest");
        // built under a name of this process's, then renamed: scripts/test.d/07-cuda-emu.sh runs
        // two passes of this suite at once, and neither may run the other's half-written file
        let part = dir.join(format!("cuda_emu_selftest.{}", std::process::id()));
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let st = Command::new(cxx)
            .args(["-std=c++17", "-O2", "-g", "-ffp-contract=off", "-I"])
            .arg(root.join("cuda/emu"))
            .arg(root.join("cuda/emu/selftest.cpp"))
            .arg(root.join("cuda/emu/emu.cpp"))
            .arg("-o")
            .arg(&part)
            .status()
            .expect("run the C++ compiler");
        assert!(st.success(), "building cuda/emu/selftest.cpp failed");
        std::fs::rename(&part, &exe).expect("rename the self-test executable");
        exe
    })
}

fn run(case: &str, env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(selftest())
        .arg(case)
        .envs(env.iter().copied())
        .output()
        .expect("run selftest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn results_are_right() {
    for case in [
        "good",
        "wmma",
        "conversions",
        "limits",
        "capture",
        "pipeline",
        "host_register",
        "host_as_device",
    ] {
        for order in ["forward", "reverse", "shuffle"] {
            let (rc, out) = run(case, &[("KVEVICT_EMU_ORDER", order)]);
            assert!(
                rc == 0 && out.ends_with("ok\n"),
                "{case} ({order}): rc {rc}\n{out}"
            );
            if case != "good" {
                break; // order only matters where threads share memory
            }
        }
    }
}

#[test]
fn opt_in_limit_follows_the_environment() {
    let (rc, out) = run("limits", &[("KVEVICT_EMU_SMEM_OPTIN", "101376")]);
    assert!(rc == 0 && out.contains("optin 101376"), "rc {rc}\n{out}");
}

#[test]
fn misuse_is_caught() {
    for (case, msg) in [
        ("deadlock", "deadlock"),
        ("exited_lane", "lane that has exited"),
        ("host_pointer", "outside every cudaMalloc allocation"),
        ("host_view", "outside every cudaMalloc allocation"),
        ("unregistered", "outside every cudaMalloc allocation"),
        ("host_as_device_off", "outside every cudaMalloc allocation"),
        ("past_registered", "outside every cudaMalloc allocation"),
        ("overrun", "bytes past the end"),
        ("far_overrun", "invalid access"),
    ] {
        let (rc, out) = run(case, &[]);
        assert!(
            rc != 0 && out.contains(msg),
            "{case}: rc {rc}, wanted {msg:?}\n{out}"
        );
        assert!(!out.contains("not caught"), "{case}\n{out}");
    }
}
