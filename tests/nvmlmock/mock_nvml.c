/*
 * A mock of NVIDIA's driver library (libnvidia-ml.so.1) for tests on machines without a GPU.
 *
 * The real nvidia-ml-py (pynvml.py) loads it through ctypes, so its symbol names, struct layouts and
 * return codes are exercised as against a driver. There is no nvml.h here: every struct below is
 * declared by hand and checked field by field against pynvml's ctypes `_fields_` (see the comments).
 * The state lives in static arrays; device handles are pointers into them (stable addresses).
 * `mock_*` functions steer it (see tests/nvmlmock/README.md). Every entry point takes one mutex,
 * except nvmlErrorString (static strings), and nvmlEventSetWait* releases it while it waits on the
 * event set's condition variable.
 *
 * -DMOCK_R535_54: a driver of 535.43-535.86, whose nvmlDeviceGetComputeRunningProcesses_v3 wrote a
 * 5-field process struct (with usedGpuCcProtectedMemory, 32 bytes) and which lacked
 * nvmlDeviceGetRunningProcessDetailList.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef unsigned int nvmlReturn_t;

/* pynvml's NVML_* return codes */
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* NVML_VALUE_TYPE_* */
enum { VT_DOUBLE = 0, VT_UINT = 1, VT_ULONG = 2, VT_ULL = 3, VT_SLL = 4, VT_SINT = 5 };

#define NO_ID 0xFFFFFFFFu /* gpuInstanceId/computeInstanceId of a process outside MIG */
#define NOT_AVAILABLE ULLONG_MAX /* NVML_VALUE_NOT_AVAILABLE_ulonglong */
#define MIB (1024ull * 1024ull)

/* ---- structs, as pynvml declares them ------------------------------------------------------- */

/* nvmlPciInfo_t: busIdLegacy c_char*16, domain, bus, device, pciDeviceId, pciSubSystemId (c_uint),
 * busId c_char*32 (68 bytes) */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

/* nvmlPciInfoExt_v1_t: version, domain, bus, device, pciDeviceId, pciSubSystemId, baseClass, subClass
 * (c_uint), busId c_char*32; version nvmlPciInfoExt_v1 = 0x1000040 */
typedef struct {
    unsigned int version, domain, bus, device, pciDeviceId, pciSubSystemId, baseClass, subClass;
    char busId[32];
} nvmlPciInfoExt_v1_t;
#define PCI_INFO_EXT_V1 0x1000040u

/* c_nvmlUtilization_t: gpu, memory (c_uint) */
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

/* c_nvmlMemory_t: total, free, used (c_ulonglong) */
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

/* c_nvmlMemory_v2_t: version c_uint, total, reserved, free, used (c_ulonglong); nvmlMemory_v2 = 0x02000028 */
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define MEMORY_V2 0x02000028u

/* c_nvmlTemperature_v1_t: version c_uint, sensorType c_uint, temperature c_int; nvmlTemperature_v1 = 0x100000C */
typedef struct {
    unsigned int version, sensorType;
    int temperature;
} nvmlTemperature_v1_t;
#define TEMPERATURE_V1 0x100000Cu

/* the process list of the unversioned nvmlDeviceGetComputeRunningProcesses (driver API v1) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* c_nvmlProcessInfo_v2_t (= _v3_t and _t in 12.535.161, 12.560.30, 13.615.71): pid c_uint, usedGpuMemory c_ulonglong,
 * gpuInstanceId, computeInstanceId c_uint (24 bytes) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

/* nvidia-ml-py 12.535.77's c_nvmlProcessInfo_t, and what drivers 535.43-535.86 wrote from _v3:
 * the four fields above plus usedGpuCcProtectedMemory c_ulonglong (32 bytes) */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessInfo_cc_t;

/* c_nvmlValue_t: union dVal c_double, uiVal c_uint, ulVal c_ulong, ullVal c_ulonglong, sllVal c_longlong,
 * siVal c_int, usVal c_ushort (13.x) */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

/* c_nvmlFieldValue_t: fieldId, scopeId (c_uint32), timestamp, latencyUsec (c_int64), valueType,
 * nvmlReturn (c_uint), value c_nvmlValue_t (40 bytes) */
typedef struct {
    uint32_t fieldId, scopeId;
    int64_t timestamp, latencyUsec;
    unsigned int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

/* c_nvmlEventData_t: device c_nvmlDevice_t, eventType, eventData (c_ulonglong), gpuInstanceId,
 * computeInstanceId (c_uint) (32 bytes); nvmlEventSetWait (v1) wrote only the first three */
typedef struct {
    void *device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
typedef struct {
    void *device;
    unsigned long long eventType, eventData;
} nvmlEventData_v1_t;
#define EVENT_XID 0x8ull
#define SUPPORTED_EVENTS 0x1Full /* SBE, DBE, PState, XID, Clock */

/* c_nvmlGpmSupport_t: version, isSupportedDevice (c_uint); NVML_GPM_SUPPORT_VERSION = 1 */
typedef struct {
    unsigned int version, isSupportedDevice;
} nvmlGpmSupport_t;

/* c_metricInfo_t: shortName, longName, unit (c_char_p) */
typedef struct {
    const char *shortName, *longName, *unit;
} nvmlGpmMetricInfo_t;

/* c_nvmlGpmMetric_t: metricId c_uint, nvmlReturn c_uint, value c_double, metricInfo c_metricInfo_t (40 bytes) */
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;

/* c_nvmlGpmMetricsGet_t: version, numMetrics (c_uint), sample1, sample2 (c_nvmlGpmSample_t), metrics
 * c_nvmlGpmMetric_t * NVML_GPM_METRIC_MAX (98 in 12.535.77, 477 in 13.615.71: only numMetrics are used);
 * NVML_GPM_METRICS_GET_VERSION = 1 */
typedef struct {
    unsigned int version, numMetrics;
    void *sample1, *sample2;
    nvmlGpmMetric_t metrics[];
} nvmlGpmMetricsGet_t;
#define GPM_METRICS_MAX 98

/* c_nvmlConfComputeMemSizeInfo_t: protectedMemSizeKib, unprotectedMemSizeKib (c_ulonglong) */
typedef struct {
    unsigned long long protectedMemSizeKib, unprotectedMemSizeKib;
} nvmlConfComputeMemSizeInfo_t;

/* Compile-time checks of the sizes pynvml's ctypes gives these structs (x86-64 / aarch64 LP64). */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40 && (MEMORY_V2 & 0xFFFFFF) == 40, "nvmlMemory_v2_t");
_Static_assert(sizeof(nvmlTemperature_v1_t) == 12, "nvmlTemperature_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t");
_Static_assert(sizeof(nvmlProcessInfo_cc_t) == 32, "nvmlProcessInfo_cc_t");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");
_Static_assert(sizeof(nvmlGpmMetric_t) == 40, "nvmlGpmMetric_t");
_Static_assert(sizeof(nvmlGpmMetricsGet_t) == 24, "nvmlGpmMetricsGet_t");
_Static_assert(sizeof(nvmlPciInfoExt_v1_t) == (PCI_INFO_EXT_V1 & 0xFFFFFF), "nvmlPciInfoExt_v1_t");

/* ---- state ---------------------------------------------------------------------------------- */

#define MAX_GPUS 8
#define MAX_MIG 7
#define MAX_PROCS 32
#define MAX_RULES 64
#define MAX_CALLS 160
#define MAX_SETS 16
#define MAX_QUEUE 64
#define MAX_SAMPLES 256

/* A device handle: what nvmlDevice_t points to. slot -1: the GPU itself, else its MIG device. */
typedef struct {
    int gpu, slot;
} mock_device_t;

typedef struct {
    unsigned int pid, gi, ci;
    unsigned long long used;
} proc_t;

typedef struct {
    int present;
    unsigned int gi, ci;
    char profile[32], name[96], uuid[96];
    unsigned long long mem_total, mem_reserved, mem_base_used;
} mig_t;

typedef struct {
    char name[96], uuid[96], bus_id[32], bus_id_legacy[16];
    unsigned int bus, pci_device_id, pci_subsystem_id;
    int lost;
    nvmlReturn_t handle_ret; /* what GetHandleByIndex returns (noperm) */
    unsigned long long mem_total, mem_reserved, mem_used;
    unsigned int util_gpu, util_mem;
    nvmlReturn_t util_ret;
    unsigned int power_mw, limit_mw;
    nvmlReturn_t limit_ret, fan_ret;
    unsigned int fan_pct, temp_c, mem_temp_c, sm_mhz, mem_mhz, pstate;
    int cc_major, cc_minor;
    double energy_mj, pcie_tx, pcie_rx, pcie_tx_rate, pcie_rx_rate, t_last;
    int pcie_supported;
    int mig_mode; /* -1: MIG not supported; 0, 1: current (= pending) mode */
    nvmlReturn_t parent_procs_ret; /* process list of the whole GPU in MIG mode */
    int gpm_supported, gpm_sample_ok;
    double gpm_sm, gpm_tensor, gpm_dram;
    int n_procs;
    proc_t procs[MAX_PROCS];
    mig_t mig[MAX_MIG];
} gpu_t;

typedef struct {
    int gpu;
    char call[64];
    nvmlReturn_t ret;
} err_rule_t;

typedef struct {
    char call[64];
    int n_ok;
    nvmlReturn_t ret;
} fail_rule_t;

typedef struct {
    char name[64];
    int count;
} call_count_t;

typedef struct {
    mock_device_t *dev;
    unsigned long long type, data;
} event_t;

typedef struct {
    int in_use, waiters;
    unsigned long long registered[MAX_GPUS];
    int head, len;
    event_t queue[MAX_QUEUE];
    pthread_cond_t cond;
} event_set_t;

typedef struct {
    int in_use, taken, gpu;
    unsigned int gi; /* NO_ID: the whole GPU */
    double t, sm, tensor, dram;
} gpm_sample_t;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_init_count, g_scenario_applied, g_variant_r535;
static char g_scenario[64];
static int g_count;
static gpu_t g_gpu[MAX_GPUS];
static mock_device_t g_dev[MAX_GPUS];
static mock_device_t g_mig_dev[MAX_GPUS][MAX_MIG];
static err_rule_t g_errs[MAX_RULES];
static fail_rule_t g_fails[MAX_RULES];
static call_count_t g_calls[MAX_CALLS];
static event_set_t g_sets[MAX_SETS];
static int g_sets_ready;
static gpm_sample_t g_samples[MAX_SAMPLES];
static int g_violations;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int64_t wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void copy_str(char *dst, size_t n, const char *src) {
    snprintf(dst, n, "%s", src);
}

/* ---- scenarios ------------------------------------------------------------------------------ */

static const unsigned int HGX_BUSES[MAX_GPUS] = {0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB};

static void add_proc(int gpu, unsigned pid, unsigned long long used, unsigned gi, unsigned ci) {
    gpu_t *g = &g_gpu[gpu];
    if (g->n_procs < MAX_PROCS) g->procs[g->n_procs++] = (proc_t){pid, gi, ci, used};
}

static void init_gpu(int i, const char *name, unsigned long long total_mib) {
    gpu_t *g = &g_gpu[i];
    memset(g, 0, sizeof *g);
    copy_str(g->name, sizeof g->name, name);
    unsigned h = 0x9e3779b9u * (unsigned)(i + 1);
    snprintf(g->uuid, sizeof g->uuid, "GPU-%08x-%04x-%04x-%04x-%012llx", h, (h >> 7) & 0xFFFF,
             0x4000 | (i & 0xFFF), 0x8000 | ((h >> 3) & 0xFFF), 0x1000000000ull * (i + 1) + h);
    g->bus = HGX_BUSES[i];
    snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", g->bus);
    snprintf(g->bus_id_legacy, sizeof g->bus_id_legacy, "0000:%02X:00.0", g->bus);
    g->pci_device_id = 0x233510DE;
    g->pci_subsystem_id = 0x18A610DE;
    g->mem_total = total_mib * MIB;
    g->mem_reserved = 570 * MIB;
    g->mem_used = (1024ull + 4096ull * i) * MIB;
    g->util_gpu = (20 + 11 * i) % 101;
    g->util_mem = (5 + 7 * i) % 101;
    g->power_mw = 120000 + 80000 * i;
    g->limit_mw = 700000;
    g->fan_ret = NVML_ERROR_NOT_SUPPORTED;
    g->temp_c = 35 + 3 * i;
    g->mem_temp_c = 40 + 2 * i;
    g->sm_mhz = 1980;
    g->mem_mhz = 3201;
    g->pstate = 0;
    g->cc_major = 9;
    g->cc_minor = 0;
    g->energy_mj = 1e9 + 1e6 * i;
    g->pcie_tx = 1e12 + 1e9 * i;
    g->pcie_rx = 2e12 + 1e9 * i;
    g->pcie_tx_rate = 5e8;
    g->pcie_rx_rate = 2e9;
    g->pcie_supported = 1;
    g->t_last = now_s();
    g->gpm_supported = 1;
    g->gpm_sample_ok = 1;
    g->gpm_sm = 60 + i;
    g->gpm_tensor = 30 + i;
    g->gpm_dram = 40 + i;
}

/* the memory size of a MIG profile: 40 for "3g.40gb" or "1c.3g.40gb" (0 if none) */
static unsigned long long profile_gb(const char *profile) {
    size_t n = strlen(profile);
    if (n < 3 || strcmp(profile + n - 2, "gb") != 0) return 0;
    const char *p = profile + n - 2;
    while (p > profile && p[-1] >= '0' && p[-1] <= '9') p--;
    return strtoull(p, NULL, 10);
}

static int mig_add(int gpu, unsigned gi, const char *profile, unsigned ci) {
    gpu_t *g = &g_gpu[gpu];
    for (int s = 0; s < MAX_MIG; s++) {
        mig_t *m = &g->mig[s];
        if (m->present) continue;
        memset(m, 0, sizeof *m);
        m->present = 1;
        m->gi = gi;
        m->ci = ci;
        copy_str(m->profile, sizeof m->profile, profile);
        char parent[sizeof g->name];
        copy_str(parent, sizeof parent, g->name);
        snprintf(m->name, sizeof m->name, "%.70s MIG %.20s", parent, profile);
        snprintf(m->uuid, sizeof m->uuid, "MIG-%08x-%04x-%04x-%04x-%012x", 0x51c0ffeeu + 97u * gpu, gi, ci,
                 0x8000 | s, 0xabc000u + 16u * gi + ci);
        unsigned long long gb = profile_gb(profile);
        m->mem_total = (gb ? gb * 1024ull + 192ull : 9984ull) * MIB;
        m->mem_reserved = 30 * MIB;
        m->mem_base_used = 13 * MIB;
        return 0;
    }
    return NVML_ERROR_INSUFFICIENT_SIZE;
}

static void scenario_mig(const char *name, int gpm) {
    g_count = 1;
    init_gpu(0, name, 81920);
    gpu_t *g = &g_gpu[0];
    g->pci_device_id = gpm ? 0x233010DE : 0x20B210DE;
    g->cc_major = gpm ? 9 : 8;
    g->mig_mode = 1;
    g->util_ret = NVML_ERROR_NOT_SUPPORTED;
    g->parent_procs_ret = NVML_ERROR_NO_PERMISSION;
    g->gpm_supported = gpm;
    mig_add(0, 1, "1c.3g.40gb", 0);
    mig_add(0, 1, "1c.3g.40gb", 1);
    mig_add(0, 2, "3g.40gb", 0);
    add_proc(0, 5001, 5000 * MIB, 1, 0);
    add_proc(0, 5002, NOT_AVAILABLE, 1, 1);
    add_proc(0, 5003, 7000 * MIB, 2, 0);
}

static int apply_scenario(const char *name) {
    memset(g_gpu, 0, sizeof g_gpu);
    memset(g_errs, 0, sizeof g_errs);
    memset(g_fails, 0, sizeof g_fails);
    for (int i = 0; i < MAX_GPUS; i++) {
        g_dev[i] = (mock_device_t){i, -1};
        for (int s = 0; s < MAX_MIG; s++) g_mig_dev[i][s] = (mock_device_t){i, s};
    }
    if (strcmp(name, "healthy") == 0) {
        g_count = 8;
        for (int i = 0; i < 8; i++) init_gpu(i, "NVIDIA H200", 143771);
        add_proc(0, 4242, 20480 * MIB, NO_ID, NO_ID);
        add_proc(0, 4343, 8192 * MIB, NO_ID, NO_ID);
        add_proc(3, 4545, 30720 * MIB, NO_ID, NO_ID);
    } else if (strcmp(name, "consumer") == 0) {
        g_count = 1;
        init_gpu(0, "NVIDIA GeForce RTX 4090", 24564);
        gpu_t *g = &g_gpu[0];
        copy_str(g->bus_id, sizeof g->bus_id, "00000000:01:00.0");
        copy_str(g->bus_id_legacy, sizeof g->bus_id_legacy, "0000:01:00.0");
        g->bus = 1;
        g->pci_device_id = 0x268410DE;
        g->mem_reserved = 340 * MIB;
        g->fan_ret = NVML_ERROR_UNKNOWN;
        g->limit_ret = NVML_ERROR_UNKNOWN;
        g->power_mw = 95000;
        g->gpm_supported = 0;
        g->mig_mode = -1;
        g->pcie_supported = 0;
        g->cc_major = 8;
        g->cc_minor = 9;
    } else if (strcmp(name, "lost") == 0 || strcmp(name, "noperm") == 0) {
        g_count = 2;
        for (int i = 0; i < 2; i++) init_gpu(i, "NVIDIA H200", 143771);
        if (name[0] == 'n') g_gpu[1].handle_ret = NVML_ERROR_NO_PERMISSION;
    } else if (strcmp(name, "mig") == 0) {
        scenario_mig("NVIDIA A100-SXM4-80GB", 0);
    } else if (strcmp(name, "mig_h100") == 0) {
        scenario_mig("NVIDIA H100 80GB HBM3", 1);
    } else if (strcmp(name, "r535_54") == 0) {
        g_count = 1;
        init_gpu(0, "NVIDIA H200", 143771);
        add_proc(0, 100, 1024 * MIB, NO_ID, NO_ID);
        add_proc(0, 200, 2048 * MIB, NO_ID, NO_ID);
        add_proc(0, 300, 3072 * MIB, NO_ID, NO_ID);
    } else if (strcmp(name, "gpm_off") == 0) {
        g_count = 1;
        init_gpu(0, "NVIDIA H200", 143771);
        g_gpu[0].gpm_sample_ok = 0;
    } else {
        g_count = 0;
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    copy_str(g_scenario, sizeof g_scenario, name);
    return 0;
}

static void ensure_scenario(void) {
    if (g_scenario_applied) return;
    g_scenario_applied = 1;
#ifdef MOCK_R535_54
    g_variant_r535 = 1;
#endif
    const char *name = getenv("MOCK_NVML_SCENARIO");
    if (!name || !*name) name = "healthy";
    if (apply_scenario(name) != 0) fprintf(stderr, "mock_nvml: unknown MOCK_NVML_SCENARIO '%s'\n", name);
    if (!g_sets_ready) {
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        for (int s = 0; s < MAX_SETS; s++) pthread_cond_init(&g_sets[s].cond, &attr);
        pthread_condattr_destroy(&attr);
        g_sets_ready = 1;
    }
}

/* ---- entry and exit: counting, injected errors, handle checks --------------------------------- */

static void count_one(const char *name) {
    for (int i = 0; i < MAX_CALLS; i++) {
        if (g_calls[i].name[0] == '\0') {
            copy_str(g_calls[i].name, sizeof g_calls[i].name, name);
            g_calls[i].count = 1;
            return;
        }
        if (strcmp(g_calls[i].name, name) == 0) {
            g_calls[i].count++;
            return;
        }
    }
}

/* "nvmlEventSetWait_v2" -> "nvmlEventSetWait" */
static void base_name(const char *sym, char *out, size_t n) {
    copy_str(out, n, sym);
    char *v = strrchr(out, '_');
    if (v && v[1] == 'v' && v[2] >= '0' && v[2] <= '9') *v = '\0';
}

static nvmlReturn_t injected(int gpu, const char *base) {
    for (int i = 0; i < MAX_RULES; i++) {
        err_rule_t *e = &g_errs[i];
        if (e->ret && (e->gpu == -1 || e->gpu == gpu) && strcmp(e->call, base) == 0) return e->ret;
    }
    for (int i = 0; i < MAX_RULES; i++) {
        fail_rule_t *f = &g_fails[i];
        if (f->ret && strcmp(f->call, base) == 0) {
            if (f->n_ok > 0) {
                f->n_ok--;
                return 0;
            }
            return f->ret;
        }
    }
    return 0;
}

static nvmlReturn_t leave(nvmlReturn_t r) {
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Lock, count the call and check init and injected errors (gpu -1: a call without a device).
 * On a non-zero return the lock is already released. */
static nvmlReturn_t enter(const char *sym, int gpu, int needs_init) {
    char base[64];
    pthread_mutex_lock(&g_mu);
    ensure_scenario();
    base_name(sym, base, sizeof base);
    count_one(sym);
    if (strcmp(base, sym) != 0) count_one(base);
    if (needs_init && g_init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t r = injected(gpu, base);
    return r ? leave(r) : 0;
}

static mock_device_t *lookup(void *h) {
    mock_device_t *d = h;
    if (d >= &g_dev[0] && d < &g_dev[g_count] && ((char *)d - (char *)g_dev) % sizeof *d == 0) return d;
    mock_device_t *m0 = &g_mig_dev[0][0];
    if (d >= m0 && d < m0 + MAX_GPUS * MAX_MIG && ((char *)d - (char *)m0) % sizeof *d == 0 &&
        d->gpu < g_count && g_gpu[d->gpu].mig[d->slot].present)
        return d;
    return NULL;
}

enum { GPU_ONLY = 0, MIG_OK = 1 };

/* enter() for a per-device call: the handle must be known and its GPU not lost. A MIG handle gets
 * NOT_SUPPORTED unless `mig` is MIG_OK. On a non-zero return the lock is already released. */
static nvmlReturn_t enter_dev(const char *sym, void *h, mock_device_t **out, int mig) {
    char base[64];
    pthread_mutex_lock(&g_mu);
    ensure_scenario();
    base_name(sym, base, sizeof base);
    count_one(sym);
    if (strcmp(base, sym) != 0) count_one(base);
    if (g_init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    mock_device_t *d = lookup(h);
    if (!d) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g_gpu[d->gpu].lost) return leave(NVML_ERROR_GPU_IS_LOST);
    nvmlReturn_t r = injected(d->gpu, base);
    if (r) return leave(r);
    if (d->slot >= 0 && mig != MIG_OK) return leave(NVML_ERROR_NOT_SUPPORTED);
    *out = d;
    return 0;
}

#define DEV_CALL(sym, h, mig)                          \
    mock_device_t *d;                                  \
    nvmlReturn_t r_ = enter_dev(sym, (h), &d, (mig));  \
    if (r_) return r_;                                 \
    gpu_t *g = &g_gpu[d->gpu];                         \
    (void)g

static void advance(gpu_t *g) {
    double t = now_s(), dt = t - g->t_last;
    if (dt > 0) {
        g->energy_mj += g->power_mw * dt; /* mW * s = mJ */
        g->pcie_tx += g->pcie_tx_rate * dt;
        g->pcie_rx += g->pcie_rx_rate * dt;
    }
    g->t_last = t;
}

static nvmlReturn_t put_str(char *buf, unsigned int len, const char *s) {
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ---- init, system -------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    nvmlReturn_t r = enter("nvmlInitWithFlags", -1, 0);
    if (r) return r;
    if (g_count == 0) return leave(NVML_ERROR_INVALID_ARGUMENT); /* unknown scenario */
    g_init_count++;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void) {
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t r = enter("nvmlShutdown", -1, 1);
    if (r) return r;
    g_init_count--;
    return leave(NVML_SUCCESS);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 25: return "Argument version mismatch";
    case 26: return "Deprecated";
    case 27: return "Not Ready";
    case 999: return "Unknown Error";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter("nvmlSystemGetDriverVersion", -1, 1);
    if (r) return r;
    return leave(put_str(version, length, g_variant_r535 ? "535.54.03" : "570.133.20"));
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter("nvmlSystemGetNVMLVersion", -1, 1);
    if (r) return r;
    return leave(put_str(version, length, g_variant_r535 ? "12.535.54.03" : "12.570.133.20"));
}

static nvmlReturn_t cuda_version(const char *sym, int *v) {
    nvmlReturn_t r = enter(sym, -1, 0); /* works before nvmlInit, as the real one */
    if (r) return r;
    if (!v) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *v = g_variant_r535 ? 12020 : 12080;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    return cuda_version("nvmlSystemGetCudaDriverVersion", v);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return cuda_version("nvmlSystemGetCudaDriverVersion_v2", v);
}

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    nvmlReturn_t r = enter("nvmlSystemGetProcessName", -1, 1);
    if (r) return r;
    for (int i = 0; i < g_count; i++)
        for (int k = 0; k < g_gpu[i].n_procs; k++)
            if (g_gpu[i].procs[k].pid == pid) return leave(put_str(name, length, "/usr/bin/python3"));
    return leave(NVML_ERROR_NOT_FOUND);
}

/* ---- device enumeration and identity ------------------------------------------------------------ */

static nvmlReturn_t device_count(const char *sym, unsigned int *count) {
    nvmlReturn_t r = enter(sym, -1, 1);
    if (r) return r;
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned)g_count;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    return device_count("nvmlDeviceGetCount_v2", count);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
    return device_count("nvmlDeviceGetCount", count);
}

static nvmlReturn_t handle_by_index(const char *sym, unsigned int index, void **device) {
    char base[64];
    base_name(sym, base, sizeof base);
    pthread_mutex_lock(&g_mu);
    ensure_scenario();
    count_one(sym);
    if (strcmp(base, sym) != 0) count_one(base);
    if (g_init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    if (index >= (unsigned)g_count || !device) return leave(NVML_ERROR_INVALID_ARGUMENT);
    gpu_t *g = &g_gpu[index];
    if (g->lost) return leave(NVML_ERROR_GPU_IS_LOST);
    nvmlReturn_t r = injected((int)index, base);
    if (r) return leave(r);
    if (g->handle_ret) return leave(g->handle_ret);
    *device = &g_dev[index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    return handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **device) {
    return handle_by_index("nvmlDeviceGetHandleByIndex", index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(void *h, unsigned int *index) {
    DEV_CALL("nvmlDeviceGetIndex", h, GPU_ONLY);
    if (!index) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *index = (unsigned)d->gpu;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(void *h, char *uuid, unsigned int length) {
    DEV_CALL("nvmlDeviceGetUUID", h, MIG_OK);
    return leave(put_str(uuid, length, d->slot >= 0 ? g->mig[d->slot].uuid : g->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(void *h, char *name, unsigned int length) {
    DEV_CALL("nvmlDeviceGetName", h, MIG_OK);
    return leave(put_str(name, length, d->slot >= 0 ? g->mig[d->slot].name : g->name));
}

static void fill_pci(gpu_t *g, nvmlPciInfo_t *pci, int legacy_only) {
    memset(pci, 0, legacy_only ? offsetof(nvmlPciInfo_t, busId) : sizeof *pci);
    copy_str(pci->busIdLegacy, sizeof pci->busIdLegacy, g->bus_id_legacy);
    pci->bus = g->bus;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    if (!legacy_only) copy_str(pci->busId, sizeof pci->busId, g->bus_id);
}

static nvmlReturn_t pci_info(const char *sym, void *h, nvmlPciInfo_t *pci, int legacy_only) {
    DEV_CALL(sym, h, GPU_ONLY);
    if (!pci) return leave(NVML_ERROR_INVALID_ARGUMENT);
    fill_pci(g, pci, legacy_only);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *pci) {
    return pci_info("nvmlDeviceGetPciInfo_v3", h, pci, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(void *h, nvmlPciInfo_t *pci) {
    return pci_info("nvmlDeviceGetPciInfo_v2", h, pci, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(void *h, nvmlPciInfo_t *pci) {
    return pci_info("nvmlDeviceGetPciInfo", h, pci, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(void *h, nvmlPciInfoExt_v1_t *pci) {
    DEV_CALL("nvmlDeviceGetPciInfoExt", h, GPU_ONLY);
    if (!pci) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (pci->version != PCI_INFO_EXT_V1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memset(pci, 0, sizeof *pci);
    pci->version = PCI_INFO_EXT_V1;
    pci->bus = g->bus;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    pci->baseClass = 3; /* display controller */
    pci->subClass = 2;  /* 3D controller */
    copy_str(pci->busId, sizeof pci->busId, g->bus_id);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    DEV_CALL("nvmlDeviceGetCudaComputeCapability", h, MIG_OK);
    if (!major || !minor) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *major = g->cc_major;
    *minor = g->cc_minor;
    return leave(NVML_SUCCESS);
}

/* ---- readings --------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
    DEV_CALL("nvmlDeviceGetUtilizationRates", h, GPU_ONLY);
    if (g->util_ret) return leave(g->util_ret);
    if (!u) return leave(NVML_ERROR_INVALID_ARGUMENT);
    u->gpu = g->util_gpu;
    u->memory = g->util_mem;
    return leave(NVML_SUCCESS);
}

/* total, reserved, used (without reserved) of a GPU or MIG device */
static void memory_of(mock_device_t *d, unsigned long long *total, unsigned long long *reserved,
                      unsigned long long *used) {
    gpu_t *g = &g_gpu[d->gpu];
    if (d->slot < 0) {
        *total = g->mem_total;
        *reserved = g->mem_reserved;
        *used = g->mem_used;
        return;
    }
    mig_t *m = &g->mig[d->slot];
    *total = m->mem_total;
    *reserved = m->mem_reserved;
    *used = m->mem_base_used;
    for (int k = 0; k < g->n_procs; k++)
        if (g->procs[k].gi == m->gi && g->procs[k].used != NOT_AVAILABLE) *used += g->procs[k].used;
    if (*used + *reserved > *total) *used = *total - *reserved;
}

/* v1: used includes the reserved memory (as drivers since R510); free = total - used */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *mem) {
    DEV_CALL("nvmlDeviceGetMemoryInfo", h, MIG_OK);
    if (!mem) return leave(NVML_ERROR_INVALID_ARGUMENT);
    unsigned long long total, reserved, used;
    memory_of(d, &total, &reserved, &used);
    mem->total = total;
    mem->used = used + reserved;
    mem->free = total - reserved - used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *h, nvmlMemory_v2_t *mem) {
    DEV_CALL("nvmlDeviceGetMemoryInfo_v2", h, MIG_OK);
    if (!mem) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (mem->version != MEMORY_V2) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    unsigned long long total, reserved, used;
    memory_of(d, &total, &reserved, &used);
    mem->total = total;
    mem->reserved = reserved;
    mem->used = used;
    mem->free = total - reserved - used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(void *h, unsigned int sensor, unsigned int *temp) {
    DEV_CALL("nvmlDeviceGetTemperature", h, GPU_ONLY);
    if (sensor != 0 || !temp) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temp_c;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(void *h, nvmlTemperature_v1_t *t) {
    DEV_CALL("nvmlDeviceGetTemperatureV", h, GPU_ONLY);
    if (!t) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (t->version != TEMPERATURE_V1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (t->sensorType != 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    t->temperature = (int)g->temp_c;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) {
    DEV_CALL("nvmlDeviceGetPowerUsage", h, GPU_ONLY);
    if (!mw) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *mw = g->power_mw;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned int *mw) {
    DEV_CALL("nvmlDeviceGetEnforcedPowerLimit", h, GPU_ONLY);
    if (g->limit_ret) return leave(g->limit_ret);
    if (!mw) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *mw = g->limit_mw;
    return leave(NVML_SUCCESS);
}

/* NVML_CLOCK_GRAPHICS 0, SM 1, MEM 2, VIDEO 3 */
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(void *h, unsigned int type, unsigned int *mhz) {
    DEV_CALL("nvmlDeviceGetClockInfo", h, GPU_ONLY);
    if (!mhz || type > 3) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *mhz = type == 2 ? g->mem_mhz : type == 3 ? 1545 : g->sm_mhz;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(void *h, unsigned int *pct) {
    DEV_CALL("nvmlDeviceGetFanSpeed", h, GPU_ONLY);
    if (g->fan_ret) return leave(g->fan_ret);
    if (!pct) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *pct = g->fan_pct;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(void *h, unsigned int *pstate) {
    DEV_CALL("nvmlDeviceGetPerformanceState", h, GPU_ONLY);
    if (!pstate) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *pstate = g->pstate;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t clocks_reasons(const char *sym, void *h, unsigned long long *reasons) {
    DEV_CALL(sym, h, GPU_ONLY);
    if (!reasons) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *reasons = 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *reasons) {
    return clocks_reasons("nvmlDeviceGetCurrentClocksEventReasons", h, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *reasons) {
    return clocks_reasons("nvmlDeviceGetCurrentClocksThrottleReasons", h, reasons);
}

static void field_value(gpu_t *g, nvmlFieldValue_t *v) {
    v->timestamp = wall_us();
    v->latencyUsec = 0;
    v->nvmlReturn = NVML_SUCCESS;
    v->value.ullVal = 0;
    if (g->lost) {
        v->nvmlReturn = NVML_ERROR_GPU_IS_LOST;
        return;
    }
    switch (v->fieldId) {
    case 82: /* NVML_FI_DEV_MEMORY_TEMP */
        v->valueType = VT_UINT;
        v->value.uiVal = g->mem_temp_c;
        break;
    case 83: /* NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ */
        v->valueType = VT_ULL;
        v->value.ullVal = (unsigned long long)g->energy_mj;
        break;
    case 3: /* NVML_FI_DEV_ECC_SBE_VOL_TOTAL */
    case 4: /* NVML_FI_DEV_ECC_DBE_VOL_TOTAL */
    case 94: /* NVML_FI_DEV_PCIE_REPLAY_COUNTER */
        v->valueType = VT_ULL;
        break;
    case 142: /* NVML_FI_DEV_REMAPPED_COR */
    case 143: /* NVML_FI_DEV_REMAPPED_UNC */
    case 144: /* NVML_FI_DEV_REMAPPED_PENDING */
    case 145: /* NVML_FI_DEV_REMAPPED_FAILURE */
        v->valueType = VT_UINT;
        break;
    case 197: /* NVML_FI_DEV_PCIE_COUNT_TX_BYTES */
    case 198: /* NVML_FI_DEV_PCIE_COUNT_RX_BYTES */
        /* As an H200 on driver 580 answers: an unsigned int that wraps every 4 GiB. */
        v->valueType = VT_UINT;
        if (!g->pcie_supported)
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        else
            v->value.uiVal = (unsigned int)((unsigned long long)(v->fieldId == 197 ? g->pcie_tx : g->pcie_rx) & 0xFFFFFFFFULL);
        break;
    default:
        v->valueType = VT_ULL;
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
}

/* A lost GPU answers SUCCESS here with NVML_ERROR_GPU_IS_LOST in every field's nvmlReturn; make the
 * whole call fail with mock_set_error(gpu, "nvmlDeviceGetFieldValues", code). */
EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(void *h, int count, nvmlFieldValue_t *values) {
    char base[] = "nvmlDeviceGetFieldValues";
    pthread_mutex_lock(&g_mu);
    ensure_scenario();
    count_one(base);
    if (g_init_count == 0) return leave(NVML_ERROR_UNINITIALIZED);
    mock_device_t *d = lookup(h);
    if (!d || count < 0 || (count > 0 && !values)) return leave(NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t r = injected(d->gpu, base);
    if (r) return leave(r);
    if (d->slot >= 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    gpu_t *g = &g_gpu[d->gpu];
    advance(g);
    for (int i = 0; i < count; i++) field_value(g, &values[i]);
    return leave(NVML_SUCCESS);
}

/* KB/s over the last 20 ms (the real one blocks that long; this one does not) */
EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(void *h, unsigned int counter, unsigned int *kbps) {
    DEV_CALL("nvmlDeviceGetPcieThroughput", h, GPU_ONLY);
    if (!kbps || counter > 1) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *kbps = (unsigned)((counter == 0 ? g->pcie_tx_rate : g->pcie_rx_rate) / 1024.0);
    return leave(NVML_SUCCESS);
}

/* ---- processes ---------------------------------------------------------------------------------- */

enum { PROC_V1, PROC_V2, PROC_CC };

/* The processes a handle sees: all of the GPU's, or on a MIG handle those of its GI and CI. */
static int visible_procs(mock_device_t *d, proc_t *out) {
    gpu_t *g = &g_gpu[d->gpu];
    int n = 0;
    for (int k = 0; k < g->n_procs; k++) {
        proc_t *p = &g->procs[k];
        if (d->slot >= 0 && (p->gi != g->mig[d->slot].gi || p->ci != g->mig[d->slot].ci)) continue;
        out[n++] = *p;
    }
    return n;
}

static nvmlReturn_t running_procs(const char *sym, void *h, unsigned int *count, void *infos, int layout) {
    DEV_CALL(sym, h, MIG_OK);
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (d->slot < 0 && g->parent_procs_ret) return leave(g->parent_procs_ret);
    proc_t procs[MAX_PROCS];
    unsigned n = (unsigned)visible_procs(d, procs);
    if (!infos || *count < n) { /* pynvml's first call: count 0, no buffer */
        *count = n;
        return leave(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    for (unsigned i = 0; i < n; i++) {
        proc_t *p = &procs[i];
        if (layout == PROC_V1) {
            ((nvmlProcessInfo_v1_t *)infos)[i] = (nvmlProcessInfo_v1_t){p->pid, p->used};
        } else if (layout == PROC_V2) {
            ((nvmlProcessInfo_v2_t *)infos)[i] = (nvmlProcessInfo_v2_t){p->pid, p->used, p->gi, p->ci};
        } else {
            ((nvmlProcessInfo_cc_t *)infos)[i] = (nvmlProcessInfo_cc_t){p->pid, p->used, p->gi, p->ci, 0};
        }
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void *h, unsigned int *count, void *infos) {
    return running_procs("nvmlDeviceGetComputeRunningProcesses", h, count, infos, PROC_V1);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *h, unsigned int *count, void *infos) {
    return running_procs("nvmlDeviceGetComputeRunningProcesses_v2", h, count, infos, PROC_V2);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, void *infos) {
#ifdef MOCK_R535_54
    return running_procs("nvmlDeviceGetComputeRunningProcesses_v3", h, count, infos, PROC_CC);
#else
    return running_procs("nvmlDeviceGetComputeRunningProcesses_v3", h, count, infos, PROC_V2);
#endif
}

EXPORT nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(void *h, nvmlConfComputeMemSizeInfo_t *info) {
    DEV_CALL("nvmlDeviceGetConfComputeMemSizeInfo", h, GPU_ONLY);
    if (!info) return leave(NVML_ERROR_INVALID_ARGUMENT);
    info->protectedMemSizeKib = 0;
    info->unprotectedMemSizeKib = g->mem_total / 1024;
    return leave(NVML_SUCCESS);
}

#ifndef MOCK_R535_54
/* Exported only by drivers from 535.98 on; the struct is not modelled: NOT_SUPPORTED. */
EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(void *h, void *plist) {
    DEV_CALL("nvmlDeviceGetRunningProcessDetailList", h, MIG_OK);
    (void)plist;
    return leave(NVML_ERROR_NOT_SUPPORTED);
}
#endif

/* ---- MIG ---------------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(void *h, unsigned int *current, unsigned int *pending) {
    DEV_CALL("nvmlDeviceGetMigMode", h, GPU_ONLY);
    if (g->mig_mode < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!current || !pending) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *current = *pending = (unsigned)g->mig_mode;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned int *count) {
    DEV_CALL("nvmlDeviceGetMaxMigDeviceCount", h, GPU_ONLY);
    if (g->mig_mode < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!count) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = MAX_MIG;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned int index, void **mig) {
    DEV_CALL("nvmlDeviceGetMigDeviceHandleByIndex", h, GPU_ONLY);
    if (g->mig_mode < 0) return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!mig || index >= MAX_MIG) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g->mig_mode != 1 || !g->mig[index].present) return leave(NVML_ERROR_NOT_FOUND);
    *mig = &g_mig_dev[d->gpu][index];
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(void *h, unsigned int *is_mig) {
    DEV_CALL("nvmlDeviceIsMigDeviceHandle", h, MIG_OK);
    if (!is_mig) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = d->slot >= 0;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(void *h, void **parent) {
    DEV_CALL("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h, MIG_OK);
    if (!parent || d->slot < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *parent = &g_dev[d->gpu];
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t instance_id(const char *sym, void *h, unsigned int *id, int compute) {
    DEV_CALL(sym, h, MIG_OK);
    if (!id || d->slot < 0) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *id = compute ? g->mig[d->slot].ci : g->mig[d->slot].gi;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(void *h, unsigned int *id) {
    return instance_id("nvmlDeviceGetGpuInstanceId", h, id, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(void *h, unsigned int *id) {
    return instance_id("nvmlDeviceGetComputeInstanceId", h, id, 1);
}

/* ---- events ------------------------------------------------------------------------------------- */

static event_set_t *lookup_set(void *s) {
    event_set_t *e = s;
    if (e >= &g_sets[0] && e < &g_sets[MAX_SETS] && ((char *)e - (char *)g_sets) % sizeof *e == 0 && e->in_use)
        return e;
    return NULL;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *types) {
    DEV_CALL("nvmlDeviceGetSupportedEventTypes", h, GPU_ONLY);
    if (!types) return leave(NVML_ERROR_INVALID_ARGUMENT);
    *types = SUPPORTED_EVENTS;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetCreate(void **set) {
    nvmlReturn_t r = enter("nvmlEventSetCreate", -1, 1);
    if (r) return r;
    if (!set) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int s = 0; s < MAX_SETS; s++) {
        event_set_t *e = &g_sets[s];
        if (e->in_use || e->waiters) continue;
        e->in_use = 1;
        e->head = e->len = 0;
        memset(e->registered, 0, sizeof e->registered);
        *set = e;
        return leave(NVML_SUCCESS);
    }
    return leave(NVML_ERROR_INSUFFICIENT_SIZE);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    DEV_CALL("nvmlDeviceRegisterEvents", h, GPU_ONLY);
    event_set_t *e = lookup_set(set);
    if (!e) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (e->waiters > 0) g_violations++; /* NVML: not thread safe against a wait on the same set */
    if (types & ~SUPPORTED_EVENTS) return leave(NVML_ERROR_NOT_SUPPORTED);
    e->registered[d->gpu] |= types;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetFree(void *set) {
    nvmlReturn_t r = enter("nvmlEventSetFree", -1, 1);
    if (r) return r;
    event_set_t *e = lookup_set(set);
    if (!e) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (e->waiters > 0) g_violations++;
    e->in_use = 0;
    e->len = 0;
    pthread_cond_broadcast(&e->cond);
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t event_wait(const char *sym, void *set, nvmlEventData_t *out, unsigned int timeout_ms) {
    nvmlReturn_t r = enter(sym, -1, 1);
    if (r) return r;
    event_set_t *e = lookup_set(set);
    if (!e || !out) return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    e->waiters++;
    while (e->in_use && e->len == 0) {
        if (pthread_cond_timedwait(&e->cond, &g_mu, &until) == ETIMEDOUT) break;
    }
    e->waiters--;
    if (!e->in_use) return leave(NVML_ERROR_UNINITIALIZED); /* freed while waiting */
    if (e->len == 0) return leave(NVML_ERROR_TIMEOUT);
    event_t ev = e->queue[e->head];
    e->head = (e->head + 1) % MAX_QUEUE;
    e->len--;
    out->device = ev.dev;
    out->eventType = ev.type;
    out->eventData = ev.data;
    out->gpuInstanceId = NO_ID;
    out->computeInstanceId = NO_ID;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return event_wait("nvmlEventSetWait_v2", set, data, timeout_ms);
}

/* v1 event data: device, eventType, eventData only */
EXPORT nvmlReturn_t nvmlEventSetWait(void *set, nvmlEventData_v1_t *data, unsigned int timeout_ms) {
    nvmlEventData_t full;
    if (!data) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = event_wait("nvmlEventSetWait", set, &full, timeout_ms);
    if (r == NVML_SUCCESS) *data = (nvmlEventData_v1_t){full.device, full.eventType, full.eventData};
    return r;
}

/* ---- GPM ---------------------------------------------------------------------------------------- */

static gpm_sample_t *lookup_sample(void *s) {
    gpm_sample_t *p = s;
    if (p >= &g_samples[0] && p < &g_samples[MAX_SAMPLES] && ((char *)p - (char *)g_samples) % sizeof *p == 0 &&
        p->in_use)
        return p;
    return NULL;
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(void *h, nvmlGpmSupport_t *support) {
    DEV_CALL("nvmlGpmQueryDeviceSupport", h, GPU_ONLY);
    if (!support) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (support->version != 1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    support->isSupportedDevice = (unsigned)g->gpm_supported;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(void **sample) {
    nvmlReturn_t r = enter("nvmlGpmSampleAlloc", -1, 1);
    if (r) return r;
    if (!sample) return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < MAX_SAMPLES; i++) {
        if (g_samples[i].in_use) continue;
        memset(&g_samples[i], 0, sizeof g_samples[i]);
        g_samples[i].in_use = 1;
        *sample = &g_samples[i];
        return leave(NVML_SUCCESS);
    }
    return leave(NVML_ERROR_MEMORY);
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(void *sample) {
    nvmlReturn_t r = enter("nvmlGpmSampleFree", -1, 1);
    if (r) return r;
    gpm_sample_t *p = lookup_sample(sample);
    if (!p) return leave(NVML_ERROR_INVALID_ARGUMENT);
    p->in_use = 0;
    return leave(NVML_SUCCESS);
}

static void take_sample(gpu_t *g, int gpu, unsigned gi, gpm_sample_t *p) {
    p->taken = 1;
    p->gpu = gpu;
    p->gi = gi;
    p->t = now_s();
    p->sm = g->gpm_sm;
    p->tensor = g->gpm_tensor;
    p->dram = g->gpm_dram;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(void *h, void *sample) {
    DEV_CALL("nvmlGpmSampleGet", h, GPU_ONLY);
    gpm_sample_t *p = lookup_sample(sample);
    if (!p) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->gpm_supported || !g->gpm_sample_ok || g->mig_mode == 1) return leave(NVML_ERROR_NOT_SUPPORTED);
    take_sample(g, d->gpu, NO_ID, p);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(void *h, unsigned int gi, void *sample) {
    DEV_CALL("nvmlGpmMigSampleGet", h, GPU_ONLY);
    gpm_sample_t *p = lookup_sample(sample);
    if (!p) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->gpm_supported || !g->gpm_sample_ok || g->mig_mode != 1) return leave(NVML_ERROR_NOT_SUPPORTED);
    int found = 0;
    for (int s = 0; s < MAX_MIG; s++) found |= g->mig[s].present && g->mig[s].gi == gi;
    if (!found) return leave(NVML_ERROR_NOT_FOUND);
    take_sample(g, d->gpu, gi, p);
    return leave(NVML_SUCCESS);
}

/* NVML_GPM_METRIC_* ids the mock answers, and their values from the sample's percentages */
static int gpm_metric(unsigned id, const gpm_sample_t *s, double *v, const char **name, const char **unit) {
    *unit = "%";
    switch (id) {
    case 1: *name = "gr_util"; *v = s->sm; break;
    case 2: *name = "sm_util"; *v = s->sm; break;
    case 3: *name = "sm_occupancy"; *v = s->sm / 2; break;
    case 5: *name = "any_tensor_util"; *v = s->tensor; break;
    case 6: *name = "dfma_tensor_util"; *v = 0; break;
    case 7: *name = "hmma_tensor_util"; *v = s->tensor; break;
    case 9: *name = "imma_tensor_util"; *v = 0; break;
    case 10: *name = "dram_bw_util"; *v = s->dram; break;
    case 11: *name = "fp64_util"; *v = s->sm / 10; break;
    case 12: *name = "fp32_util"; *v = s->sm / 4; break;
    case 13: *name = "fp16_util"; *v = s->sm / 8; break;
    case 20: *name = "pcie_tx"; *unit = "MiB/sec"; *v = g_gpu[s->gpu].pcie_tx_rate / 1048576.0; break;
    case 21: *name = "pcie_rx"; *unit = "MiB/sec"; *v = g_gpu[s->gpu].pcie_rx_rate / 1048576.0; break;
    case 60: *name = "nvlink_total_rx"; *unit = "MiB/sec"; *v = 10 * s->dram; break;
    case 61: *name = "nvlink_total_tx"; *unit = "MiB/sec"; *v = 20 * s->dram; break;
    default: return 0;
    }
    return 1;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg) {
    nvmlReturn_t r = enter("nvmlGpmMetricsGet", -1, 1);
    if (r) return r;
    if (!mg) return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (mg->version != 1) return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    gpm_sample_t *s1 = lookup_sample(mg->sample1), *s2 = lookup_sample(mg->sample2);
    if (mg->numMetrics > GPM_METRICS_MAX || !s1 || !s2 || !s1->taken || !s2->taken || s1->gpu != s2->gpu ||
        s1->gi != s2->gi || s2->t < s1->t)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (g_gpu[s2->gpu].lost) return leave(NVML_ERROR_GPU_IS_LOST);
    for (unsigned i = 0; i < mg->numMetrics; i++) {
        nvmlGpmMetric_t *m = &mg->metrics[i];
        double v = 0;
        const char *name = NULL, *unit = NULL;
        if (gpm_metric(m->metricId, s2, &v, &name, &unit)) {
            m->nvmlReturn = NVML_SUCCESS;
            m->value = v;
            m->metricInfo = (nvmlGpmMetricInfo_t){name, name, unit};
        } else {
            m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            m->value = 0;
            m->metricInfo = (nvmlGpmMetricInfo_t){NULL, NULL, NULL};
        }
    }
    return leave(NVML_SUCCESS);
}

/* ---- control functions (not NVML): the tests steer the mock with these ----------------------------- */

static int ctl_lock(int gpu) {
    pthread_mutex_lock(&g_mu);
    ensure_scenario();
    if (gpu != -1 && (gpu < 0 || gpu >= g_count)) {
        pthread_mutex_unlock(&g_mu);
        return 0;
    }
    return 1;
}

#define CTL(gpu)                                                 \
    if (!ctl_lock(gpu)) return NVML_ERROR_INVALID_ARGUMENT;      \
    gpu_t *g = (gpu) >= 0 ? &g_gpu[(gpu)] : NULL;                \
    (void)g

EXPORT int mock_reset_scenario(const char *name) {
    CTL(-1);
    int r = apply_scenario(name ? name : "healthy");
    return (int)leave((nvmlReturn_t)r);
}

EXPORT int mock_set_lost(int gpu, int lost) {
    CTL(gpu);
    g->lost = lost != 0;
    return (int)leave(0);
}

static int set_rule(int gpu, const char *call, int ret, int n_ok, int after) {
    if (!call || strlen(call) >= 64) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_RULES; i++) {
        int match = after ? g_fails[i].ret && strcmp(g_fails[i].call, call) == 0
                          : g_errs[i].ret && g_errs[i].gpu == gpu && strcmp(g_errs[i].call, call) == 0;
        if (match) {
            if (after) {
                g_fails[i].ret = (nvmlReturn_t)ret;
                g_fails[i].n_ok = n_ok;
            } else {
                g_errs[i].ret = (nvmlReturn_t)ret;
            }
            return 0;
        }
    }
    if (ret == 0) return 0;
    for (int i = 0; i < MAX_RULES; i++) {
        if (after && !g_fails[i].ret) {
            copy_str(g_fails[i].call, sizeof g_fails[i].call, call);
            g_fails[i].ret = (nvmlReturn_t)ret;
            g_fails[i].n_ok = n_ok;
            return 0;
        }
        if (!after && !g_errs[i].ret) {
            copy_str(g_errs[i].call, sizeof g_errs[i].call, call);
            g_errs[i].gpu = gpu;
            g_errs[i].ret = (nvmlReturn_t)ret;
            return 0;
        }
    }
    return NVML_ERROR_INSUFFICIENT_SIZE;
}

EXPORT int mock_set_error(int gpu, const char *call, int nvml_return) {
    CTL(gpu);
    return (int)leave((nvmlReturn_t)set_rule(gpu, call, nvml_return, 0, 0));
}

EXPORT int mock_fail_after(const char *call, int n_ok, int nvml_return) {
    CTL(-1);
    return (int)leave((nvmlReturn_t)set_rule(-1, call, nvml_return, n_ok, 1));
}

EXPORT int mock_set_util(int gpu, int gpu_pct, int mem_pct) {
    CTL(gpu);
    g->util_gpu = (unsigned)gpu_pct;
    g->util_mem = (unsigned)mem_pct;
    return (int)leave(0);
}

EXPORT int mock_set_power(int gpu, int mw) {
    CTL(gpu);
    advance(g); /* energy so far at the old power */
    g->power_mw = (unsigned)mw;
    return (int)leave(0);
}

EXPORT int mock_set_memory(int gpu, unsigned long long total, unsigned long long reserved,
                           unsigned long long used) {
    CTL(gpu);
    if (reserved + used > total) return (int)leave(NVML_ERROR_INVALID_ARGUMENT);
    g->mem_total = total;
    g->mem_reserved = reserved;
    g->mem_used = used;
    return (int)leave(0);
}

EXPORT int mock_set_pcie_counters(int gpu, unsigned long long tx, unsigned long long rx) {
    CTL(gpu);
    advance(g);
    g->pcie_tx = (double)tx;
    g->pcie_rx = (double)rx;
    return (int)leave(0);
}

/* bytes/s each way: the counters (fields 197/198), nvmlDeviceGetPcieThroughput and GPM metrics 20/21 */
EXPORT int mock_set_pcie_rates(int gpu, unsigned long long tx_bps, unsigned long long rx_bps) {
    CTL(gpu);
    advance(g);
    g->pcie_tx_rate = (double)tx_bps;
    g->pcie_rx_rate = (double)rx_bps;
    return (int)leave(0);
}

/* what nvmlDeviceGetHandleByIndex returns for one GPU (the noperm scenario's NO_PERMISSION); 0 clears */
EXPORT int mock_set_handle_error(int gpu, int nvml_return) {
    CTL(gpu);
    g->handle_ret = (nvmlReturn_t)nvml_return;
    return (int)leave(0);
}

EXPORT int mock_add_process(int gpu, unsigned int pid, unsigned long long used, unsigned int gi,
                            unsigned int ci) {
    CTL(gpu);
    if (g->n_procs >= MAX_PROCS) return (int)leave(NVML_ERROR_INSUFFICIENT_SIZE);
    add_proc(gpu, pid, used, gi, ci);
    return (int)leave(0);
}

EXPORT int mock_clear_processes(int gpu) {
    CTL(gpu);
    g->n_procs = 0;
    return (int)leave(0);
}

EXPORT int mock_inject_xid(int gpu, unsigned long long xid) {
    CTL(gpu);
    for (int s = 0; s < MAX_SETS; s++) {
        event_set_t *e = &g_sets[s];
        if (!e->in_use || !(e->registered[gpu] & EVENT_XID)) continue;
        if (e->len < MAX_QUEUE) {
            e->queue[(e->head + e->len) % MAX_QUEUE] = (event_t){&g_dev[gpu], EVENT_XID, xid};
            e->len++;
        }
        /* NVML keeps one "last XID" per GPU: every XID event still queued reports the newest one */
        for (int k = 0; k < e->len; k++) {
            event_t *ev = &e->queue[(e->head + k) % MAX_QUEUE];
            if (ev->type == EVENT_XID) ev->data = xid;
        }
        pthread_cond_broadcast(&e->cond);
    }
    return (int)leave(0);
}

EXPORT int mock_violations(void) {
    CTL(-1);
    return (int)leave((nvmlReturn_t)g_violations);
}

EXPORT int mock_call_count(const char *call) {
    CTL(-1);
    int n = 0;
    for (int i = 0; i < MAX_CALLS && g_calls[i].name[0]; i++)
        if (call && strcmp(g_calls[i].name, call) == 0) n = g_calls[i].count;
    return (int)leave((nvmlReturn_t)n);
}

EXPORT int mock_mig_create(int gpu, unsigned int gi, const char *profile, unsigned int ci) {
    CTL(gpu);
    if (!profile || g->mig_mode < 0) return (int)leave(NVML_ERROR_NOT_SUPPORTED);
    g->mig_mode = 1;
    return (int)leave((nvmlReturn_t)mig_add(gpu, gi, profile, ci));
}

EXPORT int mock_mig_destroy(int gpu, unsigned int gi, unsigned int ci) {
    CTL(gpu);
    for (int s = 0; s < MAX_MIG; s++) {
        mig_t *m = &g->mig[s];
        if (m->present && m->gi == gi && m->ci == ci) {
            m->present = 0;
            return (int)leave(0);
        }
    }
    return (int)leave(NVML_ERROR_NOT_FOUND);
}

EXPORT int mock_set_gpm(int gpu, int supported, int sm_pct, int tensor_pct, int dram_pct) {
    CTL(gpu);
    g->gpm_supported = supported != 0;
    g->gpm_sm = sm_pct;
    g->gpm_tensor = tensor_pct;
    g->gpm_dram = dram_pct;
    return (int)leave(0);
}

/* extra: GPM sample buffers allocated and not yet freed (a leak check) */
EXPORT int mock_gpm_samples_in_use(void) {
    CTL(-1);
    int n = 0;
    for (int i = 0; i < MAX_SAMPLES; i++) n += g_samples[i].in_use;
    return (int)leave((nvmlReturn_t)n);
}
