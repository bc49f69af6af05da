// Host-only check of the window and vonorm launchers' dynamic shared memory per
// architecture, from the launchers' own plans (win_plan, VoCfg): prints, per dtype,
// padded head dim and cross on/off, the largest group g that fits each arch's
// opt-in limit per block, and exits 1 when a shape that kvevict_cuda.h documents
// as supported on every arch (table `documented` below) would be refused. Runs
// without a GPU (no CUDA call); cuda/ptx_check.sh builds and runs it.
#include <stdio.h>
#include "window.cu"
#include "vonorm.cu"

namespace {

struct Arch {
    const char* name;
    size_t optin;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};
const Arch ARCHS[] = {{"sm_80", 163 * 1024}, {"sm_86", 99 * 1024}, {"sm_89", 99 * 1024},
                      {"sm_90", 227 * 1024}};

// Largest window w the launcher accepts: jc is clipped to w, so this is the worst case.
constexpr int64_t W_MAX = (int64_t)1 << 24;

template <typename T, int DKP>
int max_g(bool cross, size_t optin) {
    int best = 0;
    for (int g = 1; g <= (cross ? WIN_MAXG_CROSS : 128); ++g) {
        if (win_plan<T, DKP>(W_MAX, g, win_items(g, cross, true, true), cross, optin).jc == 0) break;
        best = g;
    }
    return best;
}

// What kvevict_cuda.h promises on sm_80, 86, 89 and 90 alike (window): every
// g <= g_all, for every dk <= dk_max of the dtype's element size.
struct Promise {
    int elem;  // bytes
    int dk_max;
    bool cross;
    int g_all;
};
const Promise documented[] = {
    {2, 128, false, 128}, {2, 256, false, 96}, {2, 256, true, 16},
    {4, 64, false, 128},  {4, 128, false, 96}, {4, 128, true, 16},
    {4, 256, false, 24},  {4, 256, true, 8},
};

template <typename T> int elem_of() { return (int)sizeof(T); }

template <typename T, int DKP>
int report_window(const char* dt) {
    int bad = 0;
    for (int cross = 0; cross < 2; ++cross) {
        printf("window %-4s dk<=%-3d %-8s max g:", dt, DKP, cross ? "cross" : "no-cross");
        int gmin = 1 << 30;
        for (const Arch& a : ARCHS) {
            const int g = max_g<T, DKP>(cross != 0, a.optin);
            printf("  %s %3d", a.name, g);
            gmin = g < gmin ? g : gmin;
        }
        printf("\n");
        for (const Promise& p : documented)
            if (p.elem == elem_of<T>() && p.cross == (cross != 0) && DKP <= p.dk_max &&
                gmin < p.g_all) {
                printf("  FAIL: documented g <= %d on every arch, but only g <= %d fits\n",
                       p.g_all, gmin);
                bad = 1;
            }
    }
    return bad;
}

template <typename T, int DKP> void report_vonorm(const char* dt) {
    for (int lo = 0; lo < 2; ++lo) {
        // one G chunk buffer; "ok x2": the double-buffered G (cp.async) fits too
        const size_t sm = VoCfg<T, DKP>::smem(lo != 0), sm2 = VoCfg<T, DKP>::smem(lo != 0, true);
        printf("vonorm %-4s dv<=%-3d %-5s %6zu / %6zu B:", dt, DKP, lo ? "hi+lo" : "hi", sm, sm2);
        for (const Arch& a : ARCHS)
            printf("  %s %-7s", a.name, sm2 <= a.optin ? "ok x2" : sm <= a.optin ? "ok" : "REFUSED");
        printf("\n");
    }
}

}  // namespace

int main() {
    int bad = 0;
    bad |= report_window<float, 64>("f32");
    bad |= report_window<float, 128>("f32");
    bad |= report_window<float, 256>("f32");
    bad |= report_window<__nv_bfloat16, 64>("bf16");
    bad |= report_window<__nv_bfloat16, 128>("bf16");
    bad |= report_window<__nv_bfloat16, 256>("bf16");
    // Llama-3-8B: bf16, dk = 128, g = 4 (LaProx exact GQA: cross on)
    for (int cross = 0; cross < 2; ++cross)
        for (const Arch& a : ARCHS) {
            const WinPlan p = win_plan<__nv_bfloat16, 128>(W_MAX, 4, win_items(4, cross != 0, true, true),
                                                            cross != 0, a.optin);
            printf("window bf16 dk=128 g=4 %-8s %s: %d positions/chunk (%d rows), %d K buffer%s, "
                   "pass1 %zu B, pass2 %zu B of %zu\n",
                   cross ? "cross" : "no-cross", a.name, p.jc, p.rcp, p.kbufs, p.kbufs > 1 ? "s" : "",
                   p.sm1, p.sm2, a.optin);
        }
    report_vonorm<float, 64>("f32");
    report_vonorm<float, 128>("f32");
    report_vonorm<float, 256>("f32");
    report_vonorm<__nv_bfloat16, 64>("bf16");
    report_vonorm<__nv_bfloat16, 128>("bf16");
    report_vonorm<__nv_bfloat16, 256>("bf16");
    printf(bad ? "smem_table: FAILED\n" : "smem_table: every documented shape fits\n");
    return bad;
}
