/* A preloaded (LD_PRELOAD) companion of NVIDIA's mock libnvidia-ml (k8s-test-infra 3b2b865d) in a process that
 * waits for NVML events, such as the device plugin's health check (k8s-device-plugin v0.20.0
 * internal/rm/health.go). It stands in for time passing on a real GPU.
 *
 * The mock trips a device's injected failure only on a "guarded" device call (pkg/gpu/mocknvml/engine/device.go
 * tickFailure: GetMemoryInfo, GetTemperature, ...), delivers the failure's Xid through nvmlEventSetWait only once
 * the device has tripped (engine/failure_injector.go Xid, bridge/events.go), and builds its devices afresh on the
 * first nvmlInit after the last nvmlShutdown (engine/engine.go Init -> createServer). The device plugin makes its
 * guarded calls while it builds its devices, shuts NVML down, and then its health check opens a session of its own
 * in which it only registers for and waits on events: on the mock, no Xid ever reaches it. On a GPU, the driver
 * raises the Xid whatever the process calls.
 *
 * So this thread joins the process's NVML session once the process has loaded the library itself (it never loads
 * it: dlopen RTLD_NOLOAD of the soname), holds a session open (the mock's devices then live as long as the
 * process), and reads every GPU's temperature once a second: a failure injected in the mock's profile or in its
 * overrides.yaml (re-read every second) trips within a second, and the health check's wait gets the Xid. It makes
 * no other call and changes nothing the process sees.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

typedef int (*nvml_init_t)(void);
typedef int (*nvml_count_t)(unsigned int *);
typedef int (*nvml_handle_t)(unsigned int, void **);
typedef int (*nvml_temperature_t)(void *, int, unsigned int *);

static void *tick(void *unused) {
    void *lib = NULL;
    (void)unused;
    while ((lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD)) == NULL) {
        usleep(100 * 1000);
    }
    nvml_init_t init = (nvml_init_t)dlsym(lib, "nvmlInit_v2");
    nvml_count_t count = (nvml_count_t)dlsym(lib, "nvmlDeviceGetCount_v2");
    nvml_handle_t handle = (nvml_handle_t)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    nvml_temperature_t temperature = (nvml_temperature_t)dlsym(lib, "nvmlDeviceGetTemperature");
    if (!init || !count || !handle || !temperature || init() != 0) {
        return NULL;
    }
    for (;;) {
        unsigned int devices = 0, celsius = 0;
        if (count(&devices) == 0) {
            for (unsigned int i = 0; i < devices; i++) {
                void *device = NULL;
                if (handle(i, &device) == 0) {
                    temperature(device, 0 /* NVML_TEMPERATURE_GPU */, &celsius);
                }
            }
        }
        sleep(1);
    }
    return NULL;
}

__attribute__((constructor)) static void start(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, tick, NULL) == 0) {
        pthread_detach(thread);
    }
}
