// kvevict CUDA emulator (feature `cuda-emu`): the runtime API and the block scheduler
// behind cuda/emu/*.h. One launch at a time (a process-wide lock); its blocks run one
// after another on the calling OS thread, and a block's threads run as coroutines, each
// until it reaches a collective (__syncthreads, a warp shuffle/ballot, a WMMA load or
// store). A collective completes when every thread it names has reached it; if no thread
// can run and none completes, the launch deadlocked (a divergent __syncthreads, a warp
// collective with an exited lane) and the emulator says so and aborts.
//
// Checked here as a GPU would fail (or worse): launch limits (grid, block, dynamic shared
// memory against cudaFuncSetAttribute and the opt-in limit), kernel pointer arguments
// outside every cudaMalloc allocation and cudaHostRegister range (unless
// kveEmuHostMemoryAsDevice(1) made every host address device memory), writes past the end of
// an allocation (guard page and canary), stream-capture rules (unsafe calls and
// legacy-stream use during a capture).
// Memory from cudaMalloc and dynamic shared memory start as all-ones bytes (NaN in f32,
// f16 and bf16), so a read before a write shows up in the results.
//
// Environment: KVEVICT_EMU_ORDER = forward | reverse | shuffle (the order blocks run, and
// threads of a block between collectives; a result that depends on it is a missing
// barrier, or blocks racing on one output),
// KVEVICT_EMU_SMEM_OPTIN = bytes (the opt-in shared-memory limit: 232448 as on sm_90,
// 166912 for sm_80, 101376 for sm_86/89), KVEVICT_EMU_NO_DEVICE=1 (no device visible).
#include "cuda_runtime.h"

#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

struct CUstream_st {
    unsigned flags = 0;
    bool capturing = false;
    bool invalidated = false;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    std::thread::id owner;
    std::vector<std::function<void()>> ops;
};
struct CUgraph_st {
    std::vector<std::function<void()>> ops;
};
struct CUgraphExec_st {
    std::vector<std::function<void()>> ops;
};

namespace kve_emu {
namespace {

[[noreturn]] void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvevict cuda-emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

long env_long(const char* name, long dflt) {
    const char* s = getenv(name);
    if (!s || !*s) return dflt;
    return strtol(s, nullptr, 10);
}

// ------------------------------------------------------------ device memory --
const size_t PAGE = 4096;
struct Alloc {
    unsigned char* base;  // of the mapping (guard page first)
    size_t map_bytes;
    size_t bytes;  // requested
    size_t rounded;  // to 256: the tail [bytes, rounded) is a canary
};
std::mutex mem_mu;
std::map<uintptr_t, Alloc> allocs;  // keyed by the user pointer
const unsigned char CANARY = 0xCD;

// A mapping with a PROT_NONE page on both sides and the block ending at the upper one.
unsigned char* guarded(size_t bytes, size_t align, unsigned char** base, size_t* map_bytes) {
    const size_t rounded = (bytes + align - 1) / align * align;
    const size_t pages = (rounded + PAGE - 1) / PAGE;
    *map_bytes = (pages + 2) * PAGE;
    void* m = mmap(nullptr, *map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    *base = static_cast<unsigned char*>(m);
    mprotect(*base, PAGE, PROT_NONE);
    mprotect(*base + (pages + 1) * PAGE, PAGE, PROT_NONE);
    return *base + PAGE + (pages * PAGE - rounded);
}

bool canary_ok(uintptr_t p, const Alloc& a) {
    const unsigned char* q = reinterpret_cast<const unsigned char*>(p);
    for (size_t i = a.bytes; i < a.rounded; ++i)
        if (q[i] != CANARY) return false;
    return true;
}

// Host ranges of cudaHostRegister: start -> bytes (mem_mu). No guard pages or canary:
// the memory is the caller's.
std::map<uintptr_t, size_t> hosts;
// kveEmuHostMemoryAsDevice: every address is device memory (mem_mu)
bool host_as_device = false;

// Whether [u, u + n) lies in the range of `m` (start -> bytes) that starts at or below u.
template <typename M, typename F>
bool in_range(const M& m, uintptr_t u, size_t n, F bytes_of) {
    auto it = m.upper_bound(u);
    if (it == m.begin()) return false;
    --it;
    const size_t b = bytes_of(it->second);
    return u - it->first <= b && n <= b - (u - it->first);
}

// Whether [p, p + n) lies in one allocation or one registered host range (n == 0: p
// within or one past its end).
bool in_device(const void* p, size_t n) {
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mem_mu);
    if (host_as_device) return p != nullptr;
    return in_range(allocs, u, n, [](const Alloc& a) { return a.bytes; }) ||
           in_range(hosts, u, n, [](size_t b) { return b; });
}

// -------------------------------------------------------- errors and modes --
thread_local cudaError_t last_error = cudaSuccess;
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

std::mutex cap_mu;
std::set<CUstream_st*> streams;  // live streams (cap_mu)

bool is_legacy(cudaStream_t s) {
    return s == nullptr || s == reinterpret_cast<cudaStream_t>(1);
}

// Stream handle check, and the capture rules of a legacy-stream operation: it would
// synchronise implicitly with every blocking stream, so a capture on one is invalidated.
cudaError_t stream_use(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(cap_mu);
    if (s == reinterpret_cast<cudaStream_t>(2)) return cudaSuccess;  // per-thread default
    if (!is_legacy(s)) return streams.count(s) ? cudaSuccess : cudaErrorInvalidResourceHandle;
    cudaError_t e = cudaSuccess;
    for (CUstream_st* c : streams)
        if (c->capturing && !(c->flags & cudaStreamNonBlocking)) {
            c->invalidated = true;
            e = cudaErrorStreamCaptureImplicit;
        }
    return e;
}

// "Potentially unsafe" calls during a capture (cudaMalloc, synchronous copies, ...),
// with the rules of cudaThreadExchangeStreamCaptureMode.
cudaError_t unsafe_call() {
    if (thread_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    std::lock_guard<std::mutex> lock(cap_mu);
    const auto me = std::this_thread::get_id();
    cudaError_t e = cudaSuccess;
    for (CUstream_st* c : streams) {
        if (!c->capturing || c->mode == cudaStreamCaptureModeRelaxed) continue;
        if (c->owner == me) {
            c->invalidated = true;
            e = cudaErrorStreamCaptureUnsupported;
        } else if (thread_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal) {
            e = cudaErrorStreamCaptureUnsupported;
        }
    }
    return e;
}

// Runs `op` now, or appends it to the capture of `s`.
cudaError_t enqueue(cudaStream_t s, std::function<void()> op) {
    cudaError_t e = stream_use(s);
    if (e != cudaSuccess) return e;
    {
        std::lock_guard<std::mutex> lock(cap_mu);
        if (!is_legacy(s) && s != reinterpret_cast<cudaStream_t>(2) && s->capturing) {
            s->ops.push_back(std::move(op));
            return cudaSuccess;
        }
    }
    op();
    return cudaSuccess;
}

// ------------------------------------------------------------- device facts --
long smem_optin() { return env_long("KVEVICT_EMU_SMEM_OPTIN", 232448); }
std::mutex fn_mu;
std::map<const void*, long> fn_smem;  // cudaFuncAttributeMaxDynamicSharedMemorySize

// ----------------------------------------------------------------- scheduler --
enum State { RUN, AT_BLOCK, AT_WARP, DONE };
enum BarOp { BAR_SYNC, BAR_AND, BAR_OR, BAR_COUNT };
enum WarpOp { W_SHFL_XOR = KVE_EMU_SHFL_XOR, W_SHFL_IDX = KVE_EMU_SHFL_IDX, W_SHFL_DOWN = KVE_EMU_SHFL_DOWN,
              W_SHFL_UP = KVE_EMU_SHFL_UP, W_BALLOT = 10, W_SYNC = 11 };

struct AsyncCopy {
    void* dst;
    const void* src;
    size_t n, zfill;
    int group;  // the commit that closes it: groups < committed are complete after waits
};
struct Thr {
    ucontext_t ctx;
    void* sp;  // the saved stack pointer (fast switch)
    void* fake;  // AddressSanitizer's fake stack of this thread while it is switched out
    std::vector<AsyncCopy> pend;  // cp.async not landed yet
    int committed;
    State st;
    uint3 tid;
    int bar_op, pred, bar_out;
    int wop, warg, wwidth;
    unsigned wmask;
    uint64_t win, wout;
};

struct Sched {
    ucontext_t main;
    std::vector<Thr> thr;
    std::vector<unsigned char*> stacks;
    int cur = 0;
    const std::function<void()>* body = nullptr;
    unsigned char* smem = nullptr;
    unsigned char* smem_base = nullptr;
    unsigned char* dyn = nullptr;  // this block's dynamic shared memory
    size_t smem_map = 0, smem_cap = 0;
    const void* fn = nullptr;
};
Sched S;
std::mutex launch_mu;
const size_t STACK_BYTES = 256 * 1024;

// Switching between the scheduler and a block's threads. On x86-64 a minimal switch of the
// callee-saved registers and the stack pointer (kve_emu_switch below): glibc's swapcontext
// also saves the signal mask (a system call each way) and the FP environment, and was most
// of the emulator's time on the llama.cpp fork's device path. Elsewhere, or with
// KVEVICT_EMU_UCONTEXT=1, ucontext as before.
#if defined(__x86_64__) && defined(__GNUC__)
#define KVE_EMU_FAST_SWITCH 1
// Saves rbp, rbx, r12-r15 on the current stack and its stack pointer in *from, then takes
// the stack `to` and pops what the switch that saved it pushed (or a new thread's frame).
extern "C" void kve_emu_switch(void** from, void* to);
asm(R"(
    .pushsection .text
    .p2align 4
    .hidden kve_emu_switch
    .type kve_emu_switch, @function
kve_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kve_emu_switch, .-kve_emu_switch
    .popsection
)");
#else
#define KVE_EMU_FAST_SWITCH 0
#endif
void* main_sp;  // the scheduler's stack pointer while a thread runs (fast switch)
}  // namespace
}  // namespace kve_emu
// AddressSanitizer's fiber hooks, present when its runtime is linked (the fuzz target; the
// emulator itself is not instrumented). It follows swapcontext by itself, clearing the shadow
// of the whole 256 KiB stack at each switch (most of a device op's time under the fuzzer); the
// fast switch tells it of each stack change instead (sanitizer/common_interface_defs.h).
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size)
    __attribute__((weak));
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old,
                                                size_t* size_old) __attribute__((weak));
// With ASan's use-after-return detection on, each fiber's fake stack is made and destroyed per
// thread: the hooks then cost twice swapcontext's (measured, fuzz/run.sh), so ucontext is kept.
extern "C" int __asan_option_detect_stack_use_after_return __attribute__((weak));
namespace kve_emu {
namespace {
bool fast_switch() {
    static const bool fast = KVE_EMU_FAST_SWITCH && !env_long("KVEVICT_EMU_UCONTEXT", 0) &&
                             !(&__asan_option_detect_stack_use_after_return &&
                               __asan_option_detect_stack_use_after_return);
    return fast;
}

// The scheduler's stack as AddressSanitizer knows it (learned as each thread first runs) and
// its fake stack while a thread runs; the fiber hooks are no-ops without the runtime.
const void* main_bottom;
size_t main_size;
void* main_fake;
// Before a switch to the stack [bottom, bottom + size); `save` null: the stack left is done.
void asan_leave(void** save, const void* bottom, size_t size) {
    if (__sanitizer_start_switch_fiber) __sanitizer_start_switch_fiber(save, bottom, size);
}
// After a switch back to a stack that `asan_leave(&save, ...)` left.
void asan_arrive(void* save, const void** bottom_old = nullptr, size_t* size_old = nullptr) {
    if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(save, bottom_old, size_old);
}

void land(Thr& t, int below) {
    size_t k = 0;
    for (size_t i = 0; i < t.pend.size(); ++i) {
        const AsyncCopy& c = t.pend[i];
        if (c.group < below) {
            memcpy(c.dst, c.src, c.n - c.zfill);
            memset(static_cast<unsigned char*>(c.dst) + (c.n - c.zfill), 0, c.zfill);
        } else {
            t.pend[k++] = c;
        }
    }
    t.pend.resize(k);
}

void thread_entry() {
    if (fast_switch()) asan_arrive(nullptr, &main_bottom, &main_size);
    (*S.body)();
    land(S.thr[S.cur], 1 << 30);  // what an exiting thread left in flight lands anyway
    S.thr[S.cur].st = DONE;
    // returning resumes S.main (uc_link); with the fast switch, switch back for good
#if KVE_EMU_FAST_SWITCH
    if (fast_switch()) {
        asan_leave(nullptr, main_bottom, main_size);
        kve_emu_switch(&S.thr[S.cur].sp, main_sp);
        abort();  // a finished thread is never resumed
    }
#endif
}

[[noreturn]] void die_in_block(const char* what) {
    const Thr& t = S.thr[S.cur];
    die("kernel %p, grid (%u,%u,%u) block (%u,%u,%u): block (%u,%u,%u) thread (%u,%u,%u): %s", S.fn,
        gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z, blockIdx.x, blockIdx.y,
        blockIdx.z, t.tid.x, t.tid.y, t.tid.z, what);
}

void yield(State st) {
    Thr& t = S.thr[S.cur];
    t.st = st;
#if KVE_EMU_FAST_SWITCH
    if (fast_switch()) {
        asan_leave(&t.fake, main_bottom, main_size);
        kve_emu_switch(&t.sp, main_sp);
        return asan_arrive(t.fake);
    }
#endif
    swapcontext(&t.ctx, &S.main);
}

int order_mode() {
    static int m = [] {
        const char* s = getenv("KVEVICT_EMU_ORDER");
        if (!s || !strcmp(s, "forward") || !*s) return 0;
        if (!strcmp(s, "reverse")) return 1;
        if (!strcmp(s, "shuffle")) return 2;
        die("KVEVICT_EMU_ORDER=%s: use forward, reverse or shuffle", s);
    }();
    return m;
}

// Completes the warp collective that lane `l` waits in, if every lane it names is there.
bool try_warp(int n, int l) {
    Thr& t0 = S.thr[l];
    const int wbase = l / 32 * 32;
    const unsigned mask = t0.wmask;
    if (!(mask >> (l - wbase) & 1u)) die_in_block("warp collective whose mask leaves out the calling lane");
    for (int b = 0; b < 32; ++b) {
        if (!(mask >> b & 1u)) continue;
        const int i = wbase + b;
        if (i >= n) die_in_block("warp collective naming a lane beyond the block");
        const Thr& t = S.thr[i];
        if (t.st == DONE) die_in_block("warp collective naming a lane that has exited");
        if (t.st != AT_WARP) return false;
        if (t.wop != t0.wop || t.wmask != t0.wmask || t.warg != t0.warg || t.wwidth != t0.wwidth)
            die_in_block("lanes of one warp in different warp collectives (divergent code)");
    }
    unsigned ballot = 0;
    for (int b = 0; b < 32; ++b)
        if (mask >> b & 1u) ballot |= (S.thr[wbase + b].pred ? 1u : 0u) << b;
    for (int b = 0; b < 32; ++b) {
        if (!(mask >> b & 1u)) continue;
        Thr& t = S.thr[wbase + b];
        if (t.wop == W_BALLOT) {
            t.wout = ballot;
        } else if (t.wop != W_SYNC) {
            const int w = t.wwidth, seg = b / w * w;
            int src = b;
            switch (t.wop) {
                case W_SHFL_XOR: src = b ^ t.warg; if (src >= seg + w) src = b; break;
                case W_SHFL_IDX: src = seg + ((t.warg % w) + w) % w; break;
                case W_SHFL_DOWN: src = b + t.warg; if (src >= seg + w) src = b; break;
                case W_SHFL_UP: src = b - t.warg; if (src < seg) src = b; break;
            }
            if (src < 0 || src > 31 || !(mask >> src & 1u)) die_in_block("shuffle from a lane outside the mask");
            t.wout = S.thr[wbase + src].win;
        }
        t.st = RUN;
    }
    return true;
}

void run_block(int n, const std::vector<int>& order) {
    for (int i = 0; i < n; ++i) {
        Thr& t = S.thr[i];
        if (fast_switch()) {
            // a frame kve_emu_switch pops: six zero registers, then "returns" into
            // thread_entry with the stack aligned as after a call
            void** top = reinterpret_cast<void**>(S.stacks[i] + PAGE + STACK_BYTES);
            top[-1] = nullptr;  // thread_entry's return address (it never returns)
            top[-2] = reinterpret_cast<void*>(&thread_entry);
            for (int r = 3; r <= 8; ++r) top[-r] = nullptr;
            t.sp = top - 8;
        } else {
            getcontext(&t.ctx);
            t.ctx.uc_stack.ss_sp = S.stacks[i] + PAGE;
            t.ctx.uc_stack.ss_size = STACK_BYTES;
            t.ctx.uc_link = &S.main;
            makecontext(&t.ctx, thread_entry, 0);
        }
        t.st = RUN;
        t.pend.clear();
        t.committed = 0;
        t.tid = uint3{(unsigned)(i % blockDim.x), (unsigned)(i / blockDim.x % blockDim.y),
                      (unsigned)(i / (blockDim.x * blockDim.y))};
    }
    for (;;) {
        for (int i : order) {
            if (S.thr[i].st != RUN) continue;
            S.cur = i;
            threadIdx = S.thr[i].tid;
#if KVE_EMU_FAST_SWITCH
            if (fast_switch()) {
                asan_leave(&main_fake, S.stacks[i] + PAGE, STACK_BYTES);
                kve_emu_switch(&main_sp, S.thr[i].sp);
                asan_arrive(main_fake);
                continue;
            }
#endif
            swapcontext(&S.main, &S.thr[i].ctx);
        }
        int live = 0, at_block = 0;
        bool released = false;
        for (int i = 0; i < n; ++i) {
            const State st = S.thr[i].st;
            live += st != DONE;
            at_block += st == AT_BLOCK;
            if (st == AT_WARP) {
                S.cur = i;
                released |= try_warp(n, i);
            }
        }
        if (live == 0) return;
        if (released) continue;
        if (at_block == live) {
            int op = -1, all = 1, any = 0, count = 0;
            for (int i = 0; i < n; ++i) {
                const Thr& t = S.thr[i];
                if (t.st != AT_BLOCK) continue;
                if (op >= 0 && op != t.bar_op) {
                    S.cur = i;
                    die_in_block("threads of one block in different __syncthreads variants");
                }
                op = t.bar_op;
                all &= t.pred != 0;
                any |= t.pred != 0;
                count += t.pred != 0;
            }
            const int out = op == BAR_AND ? all : op == BAR_OR ? any : count;
            for (int i = 0; i < n; ++i)
                if (S.thr[i].st == AT_BLOCK) {
                    S.thr[i].bar_out = out;
                    S.thr[i].st = RUN;
                }
            continue;
        }
        for (int i = 0; i < n; ++i)
            if (S.thr[i].st == AT_WARP) {
                S.cur = i;
                break;
            }
        char msg[160];
        snprintf(msg, sizeof msg,
                 "deadlock: %d live threads, %d at __syncthreads, the rest in warp collectives "
                 "their warp never completes (divergent barrier or collective)",
                 live, at_block);
        die_in_block(msg);
    }
}

// A fault inside a kernel (a guard page: past an allocation, past dynamic shared memory,
// a thread's stack overflow) says where it happened; elsewhere the previous handler runs.
volatile sig_atomic_t in_kernel = 0;
struct sigaction old_segv, old_bus;
void on_fault(int sig, siginfo_t* si, void* uc) {
    if (!in_kernel) {
        sigaction(sig, sig == SIGSEGV ? &old_segv : &old_bus, nullptr);
        return;  // the fault repeats under the previous handler
    }
    (void)uc;
    char msg[320];
    const Thr& t = S.thr[S.cur];
    const int len = snprintf(msg, sizeof msg,
        "kvevict cuda-emu: kernel %p, block (%u,%u,%u) thread (%u,%u,%u): invalid access at %p "
        "(out of bounds of an allocation or of shared memory, or a thread stack overflow)\n",
        S.fn, blockIdx.x, blockIdx.y, blockIdx.z, t.tid.x, t.tid.y, t.tid.z, si->si_addr);
    if (len > 0) (void)!write(2, msg, (size_t)len);
    abort();
}
void install_fault_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &old_segv);
        sigaction(SIGBUS, &sa, &old_bus);
    });
    // the handler runs on an alternate stack (a coroutine's may be the one overflowing)
    thread_local bool alt = false;
    if (!alt) {
        stack_t ss;
        memset(&ss, 0, sizeof ss);
        ss.ss_size = 64 * 1024;
        // mapped, not malloc'd: only the kernel holds the pointer (a leak checker, such as
        // the fuzz target's LeakSanitizer, would report a heap block)
        void* m = mmap(nullptr, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ss.ss_sp = m == MAP_FAILED ? nullptr : m;
        if (ss.ss_sp && sigaltstack(&ss, nullptr) == 0) alt = true;
    }
}

void run_grid(dim3 grid, dim3 block, size_t smem, const void* fn, const std::function<void()>& body) {
    std::lock_guard<std::mutex> lock(launch_mu);
    install_fault_handler();
    const int n = (int)(block.x * block.y * block.z);
    while ((int)S.stacks.size() < n) {
        void* m = mmap(nullptr, STACK_BYTES + PAGE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (m == MAP_FAILED) die("no memory for thread stacks");
        mprotect(m, PAGE, PROT_NONE);  // overflow faults instead of corrupting a neighbour
        S.stacks.push_back(static_cast<unsigned char*>(m));
    }
    if ((int)S.thr.size() < n) S.thr.resize(n);
    if (smem > S.smem_cap) {
        if (S.smem_base) munmap(S.smem_base, S.smem_map);
        S.smem = guarded(smem, 128, &S.smem_base, &S.smem_map);
        if (!S.smem) die("no memory for shared memory");
        S.smem_cap = smem;
    }
    // the block's bytes end at the guard page (up to 127 bytes of rounding before it)
    unsigned char* top = S.smem + (S.smem_cap + 127) / 128 * 128;
    unsigned char* dyn = top - (smem + 127) / 128 * 128;
    S.body = &body;
    S.fn = fn;
    gridDim = grid;
    blockDim = block;
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = order_mode() == 1 ? n - 1 - i : i;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    auto next = [&rng]() {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        return rng;
    };
    // blocks in the same order as threads (reverse: last block first; shuffle: a
    // permutation), so a result that depends on which block runs first shows
    const uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
    std::vector<uint64_t> border;  // the shuffled order (grids up to 2^22 blocks)
    if (order_mode() == 2 && nblocks <= ((uint64_t)1 << 22)) {
        border.resize(nblocks);
        for (uint64_t b = 0; b < nblocks; ++b) border[b] = b;
        for (uint64_t b = nblocks - 1; b > 0; --b) std::swap(border[b], border[next() % (b + 1)]);
    }
    for (uint64_t bi = 0; bi < nblocks; ++bi) {
        const uint64_t b = !border.empty() ? border[bi] : order_mode() == 1 ? nblocks - 1 - bi : bi;
        blockIdx = uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                         (unsigned)(b / ((uint64_t)grid.x * grid.y))};
        if (smem) memset(dyn, 0xFF, smem);
        if (order_mode() == 2)
            for (int i = n - 1; i > 0; --i) std::swap(order[i], order[next() % (uint64_t)(i + 1)]);
        S.dyn = dyn;
        in_kernel = 1;
        run_block(n, order);
        in_kernel = 0;
    }
}

}  // namespace

unsigned char* dyn_smem() { return S.dyn; }

cudaError_t launch(const cudaLaunchConfig_t* cfg, const void* fn, std::function<void()> body) {
    if (!cfg) return fail(cudaErrorInvalidValue);
    const dim3 g = cfg->gridDim, b = cfg->blockDim;
    if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535 ||
        b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 || b.z > 64 ||
        (uint64_t)b.x * b.y * b.z > 1024)
        return fail(cudaErrorInvalidConfiguration);
    long limit = 48 * 1024;
    {
        std::lock_guard<std::mutex> lock(fn_mu);
        auto it = fn_smem.find(fn);
        if (it != fn_smem.end()) limit = std::max(limit, it->second);
    }
    if ((long)cfg->dynamicSmemBytes > limit) return fail(cudaErrorInvalidValue);
    const size_t smem = cfg->dynamicSmemBytes;
    auto op = [g, b, smem, fn, body = std::move(body)]() { run_grid(g, b, smem, fn, body); };
    return fail(enqueue(cfg->stream, std::move(op)));
}

void check_kernel_pointer(const void* p, int index) {
    if (p && !in_device(p, 0))
        die("kernel argument %d is %p, outside every cudaMalloc allocation and registered host "
            "range (a host pointer or a stale one)", index, p);
}

void sync_block() {
    S.thr[S.cur].bar_op = BAR_SYNC;
    S.thr[S.cur].pred = 0;
    yield(AT_BLOCK);
}
static int sync_block_op(int op, int pred) {
    S.thr[S.cur].bar_op = op;
    S.thr[S.cur].pred = pred;
    yield(AT_BLOCK);
    return S.thr[S.cur].bar_out;
}
int sync_block_and(int pred) { return sync_block_op(BAR_AND, pred); }
int sync_block_or(int pred) { return sync_block_op(BAR_OR, pred); }
int sync_block_count(int pred) { return sync_block_op(BAR_COUNT, pred); }

static uint64_t warp_op(int op, unsigned mask, uint64_t v, int arg, int width, int pred) {
    if (width <= 0 || width > 32 || (width & (width - 1))) die_in_block("shuffle width not a power of two <= 32");
    Thr& t = S.thr[S.cur];
    t.wop = op;
    t.wmask = mask;
    t.win = v;
    t.warg = arg;
    t.wwidth = width;
    t.pred = pred;
    yield(AT_WARP);
    return S.thr[S.cur].wout;
}
void sync_warp(unsigned mask) { warp_op(W_SYNC, mask, 0, 0, 32, 0); }
uint64_t shfl(unsigned mask, uint64_t v, int op, int arg, int width) {
    return warp_op(op, mask, v, arg, width, 0);
}
unsigned ballot(unsigned mask, int pred) { return (unsigned)warp_op(W_BALLOT, mask, 0, 0, 32, pred); }

void async_copy(void* dst, const void* src, size_t size, size_t zfill) {
    if (size != 4 && size != 8 && size != 16) die_in_block("cp.async of a size other than 4, 8, 16");
    if (zfill > size) die_in_block("cp.async zero-fill larger than the copy");
    if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & (size - 1))
        die_in_block("cp.async with a misaligned source or destination");
    Thr& t = S.thr[S.cur];
    t.pend.push_back(AsyncCopy{dst, src, size, zfill, t.committed});
}
void async_commit() { ++S.thr[S.cur].committed; }
void async_wait(size_t prior) {
    Thr& t = S.thr[S.cur];
    land(t, t.committed - (int)prior);
}

}  // namespace kve_emu

using namespace kve_emu;

// ------------------------------------------------------------------ runtime --
extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
    if (!p) return fail(cudaErrorInvalidValue);
    cudaError_t e = unsafe_call();
    if (e != cudaSuccess) return fail(e);
    if (bytes == 0) {
        *p = nullptr;
        return cudaSuccess;
    }
    Alloc a;
    a.bytes = bytes;
    a.rounded = (bytes + 255) / 256 * 256;
    unsigned char* u = guarded(bytes, 256, &a.base, &a.map_bytes);
    if (!u) return fail(cudaErrorMemoryAllocation);
    memset(u, 0xFF, bytes);
    memset(u + bytes, CANARY, a.rounded - bytes);
    {
        std::lock_guard<std::mutex> lock(mem_mu);
        allocs[reinterpret_cast<uintptr_t>(u)] = a;
    }
    *p = u;
    return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
    if (!p) return cudaSuccess;
    cudaError_t e = unsafe_call();
    if (e != cudaSuccess) return fail(e);
    Alloc a;
    {
        std::lock_guard<std::mutex> lock(mem_mu);
        auto it = allocs.find(reinterpret_cast<uintptr_t>(p));
        if (it == allocs.end()) return fail(cudaErrorInvalidValue);
        a = it->second;
        allocs.erase(it);
    }
    if (!canary_ok(reinterpret_cast<uintptr_t>(p), a))
        die("cudaFree(%p): bytes past the end of the %zu-byte allocation were written", p, a.bytes);
    munmap(a.base, a.map_bytes);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags) {
    if (!p || bytes == 0 || (flags & ~3u)) return fail(cudaErrorInvalidValue);
    const uintptr_t u = reinterpret_cast<uintptr_t>(p);
    if (u + bytes < u) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(mem_mu);
    // no overlap with a registered range nor with device memory
    auto it = hosts.upper_bound(u + bytes - 1);
    if (it != hosts.begin() && (--it)->first + it->second > u)
        return fail(cudaErrorHostMemoryAlreadyRegistered);
    auto a = allocs.upper_bound(u + bytes - 1);
    if (a != allocs.begin() && (--a)->first + a->second.rounded > u) return fail(cudaErrorInvalidValue);
    hosts[u] = bytes;
    return cudaSuccess;
}

void kveEmuHostMemoryAsDevice(int on) {
    std::lock_guard<std::mutex> lock(mem_mu);
    host_as_device = on != 0;
}

cudaError_t cudaHostUnregister(void* p) {
    std::lock_guard<std::mutex> lock(mem_mu);
    if (!hosts.erase(reinterpret_cast<uintptr_t>(p))) return fail(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned flags) {
    if (!dev || flags != 0) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(mem_mu);
    if (!in_range(hosts, reinterpret_cast<uintptr_t>(host), 0, [](size_t b) { return b; }))
        return fail(cudaErrorInvalidValue);
    *dev = host;  // unified addressing: the same address
    return cudaSuccess;
}

static bool copy_ok(void* dst, const void* src, size_t n, int kind) {
    switch (kind) {
        case cudaMemcpyHostToHost: return true;
        case cudaMemcpyHostToDevice: return in_device(dst, n);
        case cudaMemcpyDeviceToHost: return in_device(src, n);
        case cudaMemcpyDeviceToDevice: return in_device(dst, n) && in_device(src, n);
        case cudaMemcpyDefault: return true;
        default: return false;
    }
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, int kind) {
    cudaError_t e = unsafe_call();
    if (e == cudaSuccess) e = stream_use(nullptr);
    if (e != cudaSuccess) return fail(e);
    if (n == 0) return cudaSuccess;
    if (!dst || !src || !copy_ok(dst, src, n, kind)) return fail(cudaErrorInvalidValue);
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (!dst || !src || !copy_ok(dst, src, n, kind)) return fail(cudaErrorInvalidValue);
    return fail(enqueue(s, [dst, src, n]() { memmove(dst, src, n); }));
}

cudaError_t cudaMemset(void* p, int v, size_t n) {
    cudaError_t e = unsafe_call();
    if (e == cudaSuccess) e = stream_use(nullptr);
    if (e != cudaSuccess) return fail(e);
    if (n == 0) return cudaSuccess;
    if (!in_device(p, n)) return fail(cudaErrorInvalidValue);
    memset(p, v, n);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
    if (n == 0) return cudaSuccess;
    if (!in_device(p, n)) return fail(cudaErrorInvalidValue);
    return fail(enqueue(s, [p, v, n]() { memset(p, v, n); }));
}

cudaError_t cudaDeviceSynchronize(void) {
    std::lock_guard<std::mutex> lock(cap_mu);
    for (CUstream_st* c : streams)
        if (c->capturing) return fail(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* n) {
    if (!n) return fail(cudaErrorInvalidValue);
    if (env_long("KVEVICT_EMU_NO_DEVICE", 0)) {
        *n = 0;
        return fail(cudaErrorNoDevice);
    }
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* d) {
    if (!d) return fail(cudaErrorInvalidValue);
    *d = 0;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }

cudaError_t cudaDeviceGetAttribute(int* v, enum cudaDeviceAttr a, int dev) {
    if (!v) return fail(cudaErrorInvalidValue);
    if (dev != 0) return fail(cudaErrorInvalidDevice);
    switch (a) {
        case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 * 1024; break;
        case cudaDevAttrWarpSize: *v = 32; break;
        case cudaDevAttrMultiProcessorCount: *v = 132; break;
        case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
        case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)smem_optin() + 1024; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)smem_optin(); break;
        default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* fn, enum cudaFuncAttribute a, int v) {
    if (!fn) return fail(cudaErrorInvalidValue);
    if (a == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v < 0 || v > smem_optin())
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(fn_mu);
    fn_smem[fn] = v;
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
    if (!s || (flags & ~1u)) return fail(cudaErrorInvalidValue);
    CUstream_st* st = new CUstream_st;
    st->flags = flags;
    std::lock_guard<std::mutex> lock(cap_mu);
    streams.insert(st);
    *s = st;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    std::lock_guard<std::mutex> lock(cap_mu);
    if (!streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
    streams.erase(s);
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    cudaError_t e = stream_use(s);
    if (e != cudaSuccess) return fail(e);
    if (is_legacy(s) || s == reinterpret_cast<cudaStream_t>(2)) return cudaSuccess;
    std::lock_guard<std::mutex> lock(cap_mu);
    if (s->capturing) {
        s->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    if (is_legacy(s) || s == reinterpret_cast<cudaStream_t>(2)) return fail(cudaErrorStreamCaptureUnsupported);
    if (mode < cudaStreamCaptureModeGlobal || mode > cudaStreamCaptureModeRelaxed) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(cap_mu);
    if (!streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
    if (s->capturing) return fail(cudaErrorIllegalState);
    s->capturing = true;
    s->invalidated = false;
    s->mode = mode;
    s->owner = std::this_thread::get_id();
    s->ops.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* g) {
    if (!g) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(cap_mu);
    if (is_legacy(s) || !streams.count(s)) return fail(cudaErrorInvalidResourceHandle);
    if (!s->capturing) return fail(cudaErrorIllegalState);
    if (s->mode != cudaStreamCaptureModeRelaxed && s->owner != std::this_thread::get_id())
        return fail(cudaErrorStreamCaptureWrongThread);
    s->capturing = false;
    if (s->invalidated) {
        *g = nullptr;
        s->ops.clear();
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    CUgraph_st* gr = new CUgraph_st;
    gr->ops.swap(s->ops);
    *g = gr;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* st) {
    if (!st) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(cap_mu);
    if (is_legacy(s) || !streams.count(s)) {
        *st = cudaStreamCaptureStatusNone;
        return cudaSuccess;
    }
    *st = !s->capturing ? cudaStreamCaptureStatusNone
          : s->invalidated ? cudaStreamCaptureStatusInvalidated
                           : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
    if (!mode || *mode < cudaStreamCaptureModeGlobal || *mode > cudaStreamCaptureModeRelaxed)
        return fail(cudaErrorInvalidValue);
    std::swap(*mode, thread_mode);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* e, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    if (!e || !g) return fail(cudaErrorInvalidValue);
    CUgraphExec_st* x = new CUgraphExec_st;
    x->ops = g->ops;
    *e = x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    if (!e) return fail(cudaErrorInvalidValue);
    for (const auto& op : e->ops) {
        cudaError_t r = enqueue(s, op);
        if (r != cudaSuccess) return fail(r);
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
#define KVE_EMU_NAME(x) case x: return #x;
        KVE_EMU_NAME(cudaSuccess)
        KVE_EMU_NAME(cudaErrorInvalidValue)
        KVE_EMU_NAME(cudaErrorMemoryAllocation)
        KVE_EMU_NAME(cudaErrorInitializationError)
        KVE_EMU_NAME(cudaErrorInvalidConfiguration)
        KVE_EMU_NAME(cudaErrorInvalidDevicePointer)
        KVE_EMU_NAME(cudaErrorInvalidMemcpyDirection)
        KVE_EMU_NAME(cudaErrorInsufficientDriver)
        KVE_EMU_NAME(cudaErrorNoDevice)
        KVE_EMU_NAME(cudaErrorInvalidDevice)
        KVE_EMU_NAME(cudaErrorInvalidResourceHandle)
        KVE_EMU_NAME(cudaErrorIllegalAddress)
        KVE_EMU_NAME(cudaErrorLaunchOutOfResources)
        KVE_EMU_NAME(cudaErrorHostMemoryAlreadyRegistered)
        KVE_EMU_NAME(cudaErrorHostMemoryNotRegistered)
        KVE_EMU_NAME(cudaErrorLaunchFailure)
        KVE_EMU_NAME(cudaErrorStreamCaptureUnsupported)
        KVE_EMU_NAME(cudaErrorStreamCaptureInvalidated)
        KVE_EMU_NAME(cudaErrorStreamCaptureMerge)
        KVE_EMU_NAME(cudaErrorStreamCaptureUnmatched)
        KVE_EMU_NAME(cudaErrorStreamCaptureUnjoined)
        KVE_EMU_NAME(cudaErrorStreamCaptureIsolation)
        KVE_EMU_NAME(cudaErrorStreamCaptureImplicit)
        KVE_EMU_NAME(cudaErrorStreamCaptureWrongThread)
        KVE_EMU_NAME(cudaErrorUnknown)
        KVE_EMU_NAME(cudaErrorIllegalState)
#undef KVE_EMU_NAME
        default: return "cudaErrorUnknown";
    }
}

const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

}  // extern "C"
