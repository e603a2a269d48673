// Command rpw-node runs the upstream kubelet (k8s.io/kubernetes/pkg/kubelet, the version the
// control plane is built from) as a hollow node, the way kubemark does: a fake CRI runtime,
// a stub container manager and a fake cadvisor stand in for containers, cgroups and the
// machine. Everything that decides about a pod - admission, the allocation manager, the
// pending-resize queue and its retries, the status manager, pod termination - is the
// kubelet's own code.
//
// What it adds to kubemark's hollow kubelet, each needed for in-place resize:
//   - the node's size (kubemark's fake cadvisor is fixed at 1 core / 3.75 GiB);
//   - allocatable changeable while it runs (a reservation file re-read at every status sync);
//   - pod cgroup configs kept in memory (the stub answers "not implemented", so every
//     actuation would fail);
//   - container resources recorded by the runtime as containerd reports them, and a stop
//     that takes the container's grace period;
//   - pod memory usage, zero unless a test sets it with a pod annotation (the kubelet will
//     not lower a memory limit without a usage, nor below it);
//   - real events, sent to the API server;
//   - containers ready only once they run, as the prober manager reports them.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/version"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	kubetypes "k8s.io/kubernetes/pkg/kubelet/types"
	"k8s.io/kubernetes/pkg/kubemark"
)

type nodeFlags struct {
	kubeconfig      string
	name            string
	rootDir         string
	cpu             string
	memory          string
	maxPods         int
	reservationFile string
	stopGraceCap    time.Duration
	statusEvery     time.Duration
	featureGates    string
	qps             float64
	burst           int
	clearCallsEvery time.Duration
}

func parseFlags() *nodeFlags {
	f := &nodeFlags{}
	klog.InitFlags(nil)
	flag.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the API server")
	flag.StringVar(&f.name, "name", "node-1", "node name")
	flag.StringVar(&f.rootDir, "root-dir", "", "kubelet root directory (state, checkpoints, logs, CRI socket)")
	flag.StringVar(&f.cpu, "cpu", "8", "CPU capacity, whole cores")
	flag.StringVar(&f.memory, "memory", "16Gi", "memory capacity")
	flag.IntVar(&f.maxPods, "max-pods", 110, "pod capacity")
	flag.StringVar(&f.reservationFile, "reservation-file", "",
		"file with the node's reserved resources (lines like cpu=2 or memory=1Gi); allocatable is capacity minus it, re-read at every status sync")
	flag.DurationVar(&f.stopGraceCap, "stop-grace-cap", -1,
		"longest a container takes to stop (negative: its whole grace period, as a real container that ignores SIGTERM)")
	flag.DurationVar(&f.statusEvery, "node-status-update-frequency", time.Second,
		"how often the kubelet syncs the Node status (and re-reads the reservation)")
	flag.StringVar(&f.featureGates, "feature-gates", "", "kubelet feature gates, A=true,B=false")
	flag.Float64Var(&f.qps, "kube-api-qps", 50, "client QPS")
	flag.IntVar(&f.burst, "kube-api-burst", 100, "client burst")
	flag.DurationVar(&f.clearCallsEvery, "clear-call-log-every", time.Minute,
		"how often the fake runtime's call log is emptied (it grows with every CRI call otherwise)")
	versionFlag := flag.Bool("version", false, "print the kubelet version and exit")
	flag.Parse()
	if *versionFlag {
		fmt.Printf("Kubernetes %s\n", version.Get().GitVersion)
		os.Exit(0)
	}
	return f
}

func main() {
	f := parseFlags()
	if err := run(f); err != nil {
		klog.ErrorS(err, "rpw-node failed")
		klog.Flush()
		os.Exit(1)
	}
}

func run(f *nodeFlags) error {
	klog.InfoS("Starting hollow kubelet", "node", f.name, "version", version.Get().GitVersion)
	if f.kubeconfig == "" || f.rootDir == "" {
		return fmt.Errorf("--kubeconfig and --root-dir are required")
	}
	if f.featureGates != "" {
		gates := map[string]bool{}
		for _, kv := range strings.Split(f.featureGates, ",") {
			name, value, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("bad --feature-gates entry %q", kv)
			}
			gates[strings.TrimSpace(name)] = strings.TrimSpace(value) == "true"
		}
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(gates); err != nil {
			return fmt.Errorf("--feature-gates: %w", err)
		}
	}
	cpu, err := resource.ParseQuantity(f.cpu)
	if err != nil || cpu.MilliValue()%1000 != 0 || cpu.Value() < 1 {
		return fmt.Errorf("--cpu must be a whole number of cores, got %q", f.cpu)
	}
	memory, err := resource.ParseQuantity(f.memory)
	if err != nil || memory.Value() < 1 {
		return fmt.Errorf("--memory: bad quantity %q", f.memory)
	}
	rootDir, err := filepath.Abs(f.rootDir)
	if err != nil {
		return err
	}
	for _, d := range []string{rootDir, filepath.Join(rootDir, "static-pods"), filepath.Join(rootDir, "pod-logs"), filepath.Join(rootDir, "pki")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	restConfig, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restConfig.UserAgent = "rpw-node/" + f.name
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS = float32(f.qps)
	restConfig.Burst = f.burst
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	flags, config := kubeletConfig(f, rootDir)

	heartbeatConfig := *restConfig
	heartbeatConfig.Timeout = 10 * time.Second
	heartbeatConfig.QPS = -1
	heartbeatClient, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return err
	}

	pods := newPodCgroups()
	endpoint := "unix://" + filepath.Join(rootDir, "cri.sock")
	_ = os.Remove(filepath.Join(rootDir, "cri.sock"))
	fakeRuntime := fakeremote.NewFakeRemoteRuntime()
	if err := fakeRuntime.Start(endpoint); err != nil {
		return fmt.Errorf("fake runtime: %w", err)
	}
	defer fakeRuntime.Stop()
	go clearCallLogs(ctx, fakeRuntime, f.clearCallsEvery)
	runtimeClient, err := newRuntimeClient(ctx, endpoint)
	if err != nil {
		return fmt.Errorf("runtime client: %w", err)
	}
	runtime := &runtimeShim{
		RuntimeService: runtimeClient,
		fake:           fakeRuntime.RuntimeService,
		pods:           pods,
		stopGraceCap:   f.stopGraceCap,
	}

	capacity := machine{cores: int(cpu.Value()), memory: memory.Value()}
	containerManager := &containerManager{
		ContainerManager: cm.NewStubContainerManager(),
		reservation:      reservationFile(f.reservationFile),
		pods:             pods,
		machine:          capacity,
	}
	cadvisor := newCadvisor(f.name, capacity, pods)

	hollow := kubemark.NewHollowKubelet(
		flags, config, client, heartbeatClient, cadvisor,
		fakeRuntime.ImageService, runtime, containerManager,
	)
	// A nil recorder makes RunKubelet build the real one, sending events to the API server
	// (kubemark drops them into a FakeRecorder).
	hollow.KubeletDeps.Recorder = nil
	hollow.KubeletDeps.EventClient = client.CoreV1()
	hollow.KubeletDeps.ProbeManager = probeManager{}

	go hollow.Run(ctx)
	<-ctx.Done()
	klog.InfoS("Stopping hollow kubelet", "node", f.name)
	klog.Flush()
	return nil
}

// kubeletConfig is kubemark's GetHollowKubeletConfig with every path under rootDir (the
// original makes temporary directories under a fixed path) and no kubelet server ports.
func kubeletConfig(f *nodeFlags, rootDir string) (*options.KubeletFlags, *kubeletconfig.KubeletConfiguration) {
	flags := options.NewKubeletFlags()
	flags.RootDirectory = rootDir
	flags.CertDirectory = filepath.Join(rootDir, "pki")
	flags.HostnameOverride = f.name
	flags.MinimumGCAge = metav1.Duration{Duration: time.Minute}
	flags.MaxContainerCount = 100
	flags.MaxPerPodContainerCount = 2
	flags.NodeLabels = map[string]string{}

	c, err := options.NewKubeletConfiguration()
	if err != nil {
		panic(err)
	}
	c.ContainerRuntimeEndpoint = "unix://" + filepath.Join(rootDir, "cri.sock")
	c.ImageServiceEndpoint = c.ContainerRuntimeEndpoint
	c.StaticPodURL = ""
	c.StaticPodPath = filepath.Join(rootDir, "static-pods")
	c.PodLogsDir = filepath.Join(rootDir, "pod-logs")
	c.EnableServer = false
	c.Port = 0
	c.ReadOnlyPort = 0
	c.HealthzPort = 0
	c.FileCheckFrequency.Duration = 20 * time.Second
	c.HTTPCheckFrequency.Duration = 20 * time.Second
	c.NodeStatusUpdateFrequency.Duration = f.statusEvery
	c.NodeStatusReportFrequency.Duration = time.Minute
	c.SyncFrequency.Duration = 10 * time.Second
	c.EvictionPressureTransitionPeriod.Duration = 5 * time.Minute
	c.MaxPods = int32(f.maxPods)
	c.PodsPerCore = 0
	// Any address: pods get a resolv.conf, and no MissingClusterDNS warning per pod.
	c.ClusterDNS = []string{"10.0.0.10"}
	c.ImageGCHighThresholdPercent = 90
	c.ImageGCLowThresholdPercent = 80
	c.ProviderID = "rpw://" + f.name
	c.VolumeStatsAggPeriod.Duration = time.Minute
	c.CgroupRoot = ""
	c.CPUCFSQuota = true
	c.EnableControllerAttachDetach = false
	c.EnableDebuggingHandlers = false
	c.CgroupsPerQOS = false
	c.HairpinMode = kubeletconfig.HairpinVeth
	c.MaxOpenFiles = 1024
	c.RegistryBurst = 10
	c.RegistryPullQPS = 5.0
	c.ResolverConfig = kubetypes.ResolvConfDefault
	c.KubeletCgroups = "/kubelet"
	c.SerializeImagePulls = true
	c.SystemCgroups = ""
	c.ProtectKernelDefaults = false
	c.RegisterNode = true
	c.LocalStorageCapacityIsolation = true
	// The fake OS fails every stat of a container log: one error per container per check.
	c.ContainerLogMonitorInterval.Duration = time.Hour
	return flags, c
}

// clearCallLogs empties the fake runtime's and image service's record of calls, which only
// tests read and which otherwise grows with every CRI call for the life of the node.
func clearCallLogs(ctx context.Context, r *fakeremote.RemoteRuntime, every time.Duration) {
	if every <= 0 {
		return
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		r.RuntimeService.Lock()
		r.RuntimeService.Called = r.RuntimeService.Called[:0]
		r.RuntimeService.Unlock()
		r.ImageService.Lock()
		r.ImageService.Called = r.ImageService.Called[:0]
		r.ImageService.Unlock()
	}
}
