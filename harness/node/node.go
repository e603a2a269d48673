package main

import (
	"math"
	"os"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	probetest "k8s.io/kubernetes/pkg/kubelet/prober/testing"
)

// probeManager runs no probe, as kubemark's stand-in does, but reports what the kubelet's
// prober manager reports for containers without probes (UpdatePodStatus in
// pkg/kubelet/prober/prober_manager.go): a container is started and ready once it runs, an
// init container that is not a sidecar is ready once it exited 0. Kubemark's stand-in marks
// every container ready, a waiting one included: a new pod was then Ready while its phase was
// still Pending, and the Eviction API, which lets a Pending pod go whatever its budget says,
// evicted a pod a PodDisruptionBudget counted as healthy. UpdatePodStatus itself, whose
// arguments differ between versions, is in the compat files.
type probeManager struct{ probetest.FakeManager }

func reportProbed(pod *v1.Pod, status *v1.PodStatus) {
	for i := range status.ContainerStatuses {
		markRunning(&status.ContainerStatuses[i])
	}
	sidecars := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		sidecars[c.Name] = c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways
	}
	for i := range status.InitContainerStatuses {
		c := &status.InitContainerStatuses[i]
		if sidecars[c.Name] {
			markRunning(c)
			continue
		}
		started := c.State.Running != nil
		c.Started = &started
		c.Ready = c.State.Terminated != nil && c.State.Terminated.ExitCode == 0
	}
}

func markRunning(c *v1.ContainerStatus) {
	running := c.State.Running != nil
	c.Started = &running
	c.Ready = running
}

// machine is the node's size as cadvisor would report it.
type machine struct {
	cores  int
	memory int64
}

// fakeCadvisor reports the node's size and, for the pod cgroups of podCgroups, the pod's
// memory usage (podCgroups.usage): the kubelet reads it before it lowers a pod's memory
// limit and refuses the resize when it is missing or the new limit is not above it. Its MachineInfo and ContainerInfoV2 are in the compat_*.go
// files (cadvisor's types and the method signatures change between Kubernetes versions).
type fakeCadvisor struct {
	cadvisortest.Fake
	machine machine
	pods    *podCgroups
}

func newCadvisor(name string, m machine, pods *podCgroups) *fakeCadvisor {
	return &fakeCadvisor{Fake: cadvisortest.Fake{NodeName: name}, machine: m, pods: pods}
}

// containerManager is the stub container manager of kubemark with two changes: the node's
// reservation (capacity minus allocatable) is read from a file, so a test can change a
// node's room while the kubelet runs, and pod cgroups are kept in memory.
type containerManager struct {
	cm.ContainerManager
	reservation reservationFile
	pods        *podCgroups
	machine     machine // for GetNodeAllocatableAbsolute where a version needs it (compat_*.go)
}

// allocatableAbsolute is the node's size less its reservation, what a real container
// manager answers for GetNodeAllocatableAbsolute.
func (m *containerManager) allocatableAbsolute() v1.ResourceList {
	cpu := *resource.NewQuantity(int64(m.machine.cores), resource.DecimalSI)
	memory := *resource.NewQuantity(m.machine.memory, resource.BinarySI)
	reserved := m.reservation.read()
	if r, ok := reserved[v1.ResourceCPU]; ok {
		cpu.Sub(r)
	}
	if r, ok := reserved[v1.ResourceMemory]; ok {
		memory.Sub(r)
	}
	return v1.ResourceList{v1.ResourceCPU: cpu, v1.ResourceMemory: memory}
}

func (m *containerManager) GetNodeAllocatableReservation() v1.ResourceList {
	return m.reservation.read()
}

func (m *containerManager) NewPodContainerManager() cm.PodContainerManager {
	return m.pods
}

// reservationFile holds lines like "cpu=2" and "memory=1Gi". A missing or empty file
// reserves nothing; a line that does not parse is logged and left out, so a typo never
// stops the node.
type reservationFile string

func (f reservationFile) read() v1.ResourceList {
	if f == "" {
		return nil
	}
	data, err := os.ReadFile(string(f))
	if err != nil {
		if !os.IsNotExist(err) {
			klog.ErrorS(err, "Cannot read the reservation file", "path", string(f))
		}
		return nil
	}
	reserved := v1.ResourceList{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		q, err := resource.ParseQuantity(strings.TrimSpace(value))
		if !ok || err != nil {
			klog.ErrorS(err, "Ignoring a reservation line", "path", string(f), "line", line)
			continue
		}
		reserved[v1.ResourceName(strings.TrimSpace(name))] = q
	}
	return reserved
}

// podCgroups is a pod container manager without cgroups: the config of each pod's cgroup is
// a record in memory. It is seeded from the sandbox's resources when the runtime creates the
// sandbox (what the kubelet would have written into the cgroup), written by the kubelet when
// it actuates a resize, and dropped with the sandbox.
//
// A pod's memory usage is zero (no processes run), unless the pod carries the harness-only
// annotation memoryUsageAnnotation (a quantity): a test sets it to make the kubelet refuse a
// memory limit lowered below it, as it would for a process using that much. It is read from
// the kubelet's copy of the pod each time the kubelet hands the pod to the pod container
// manager, which it does right before it checks a resize against the usage.
type podCgroups struct {
	mu      sync.Mutex
	configs map[types.UID]*cm.ResourceConfig
	names   map[string]types.UID
	usage   map[types.UID]uint64
}

// memoryUsageAnnotation sets the memory usage the node reports for a pod (harness only; see
// docs/control-plane.md).
const memoryUsageAnnotation = "harness.resize-preemption.io/memory-usage"

var _ cm.PodContainerManager = &podCgroups{}

func newPodCgroups() *podCgroups {
	return &podCgroups{
		configs: map[types.UID]*cm.ResourceConfig{},
		names:   map[string]types.UID{},
		usage:   map[types.UID]uint64{},
	}
}

const cpuPeriod uint64 = 100000

func cgroupName(uid types.UID) (cm.CgroupName, string) {
	return cm.CgroupName{"kubepods", "pod" + string(uid)}, "/kubepods/pod" + string(uid)
}

// seed records the config a new pod cgroup gets (a zero memory limit is unlimited).
func (p *podCgroups) seed(uid types.UID, memoryLimit, cpuQuota int64, cpuShares uint64) {
	config := &cm.ResourceConfig{}
	if memoryLimit > 0 {
		config.Memory = &memoryLimit
	}
	if cpuQuota != 0 {
		config.CPUQuota = &cpuQuota
	}
	if cpuShares != 0 {
		config.CPUShares = &cpuShares
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.configs[uid] = withDefaults(config)
	_, name := cgroupName(uid)
	p.names[name] = uid
}

func (p *podCgroups) drop(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.configs, uid)
	delete(p.usage, uid)
	_, name := cgroupName(uid)
	delete(p.names, name)
}

// noteUsage records the memory usage pod's annotation sets (none: zero). A value that does
// not parse is logged and counts as zero, so a typo never stops the node. Called with mu held.
func (p *podCgroups) noteUsage(pod *v1.Pod) {
	text, ok := pod.Annotations[memoryUsageAnnotation]
	if !ok {
		delete(p.usage, pod.UID)
		return
	}
	q, err := resource.ParseQuantity(text)
	if err != nil || q.Sign() < 0 {
		klog.ErrorS(err, "Ignoring a memory usage annotation", "pod", klog.KObj(pod), "value", text)
		delete(p.usage, pod.UID)
		return
	}
	p.usage[pod.UID] = uint64(q.Value())
}

// usageOf is the memory usage of the pod whose cgroup is name.
func (p *podCgroups) usageOf(name string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.usage[p.names[name]]
}

func (p *podCgroups) knownCgroup(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.names[name]
	return ok
}

// withDefaults fills what an unlimited cgroup v2 reports: memory max, no CPU quota, the
// minimum weight's shares, the default period.
func withDefaults(c *cm.ResourceConfig) *cm.ResourceConfig {
	if c.Memory == nil {
		unlimited := int64(math.MaxInt64)
		c.Memory = &unlimited
	}
	if c.CPUQuota == nil {
		noQuota := int64(-1)
		c.CPUQuota = &noQuota
	}
	if c.CPUShares == nil {
		minShares := uint64(2)
		c.CPUShares = &minShares
	}
	if c.CPUPeriod == nil {
		period := cpuPeriod
		c.CPUPeriod = &period
	}
	return c
}

func copyConfig(c *cm.ResourceConfig) *cm.ResourceConfig {
	out := &cm.ResourceConfig{}
	if c.Memory != nil {
		v := *c.Memory
		out.Memory = &v
	}
	if c.CPUQuota != nil {
		v := *c.CPUQuota
		out.CPUQuota = &v
	}
	if c.CPUShares != nil {
		v := *c.CPUShares
		out.CPUShares = &v
	}
	if c.CPUPeriod != nil {
		v := *c.CPUPeriod
		out.CPUPeriod = &v
	}
	return out
}

func (p *podCgroups) record(pod *v1.Pod) *cm.ResourceConfig {
	p.noteUsage(pod)
	config, ok := p.configs[pod.UID]
	if !ok {
		// A pod whose sandbox this process did not create (the node restarted): its cgroup
		// would hold what its allocation says.
		config = withDefaults(resourceConfigForPod(pod))
		p.configs[pod.UID] = config
		_, name := cgroupName(pod.UID)
		p.names[name] = pod.UID
	}
	return config
}

func (p *podCgroups) GetPodContainerName(pod *v1.Pod) (cm.CgroupName, string) {
	return cgroupName(pod.UID)
}

// The methods of cm.PodContainerManager whose signatures change between Kubernetes versions
// (a klog.Logger argument) are in the compat_*.go files; they call ensure and set.

func (p *podCgroups) ensure(pod *v1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record(pod)
}

func (p *podCgroups) set(pod *v1.Pod, config *cm.ResourceConfig) {
	p.mu.Lock()
	defer p.mu.Unlock()
	current := p.record(pod)
	set := copyConfig(config)
	if set.Memory != nil {
		current.Memory = set.Memory
	}
	if set.CPUQuota != nil {
		current.CPUQuota = set.CPUQuota
	}
	if set.CPUShares != nil {
		current.CPUShares = set.CPUShares
	}
	if set.CPUPeriod != nil {
		current.CPUPeriod = set.CPUPeriod
	}
}

func (p *podCgroups) Exists(*v1.Pod) bool { return true }

func (p *podCgroups) IsPodCgroup(string) (bool, types.UID) { return false, "" }

func (p *podCgroups) GetPodCgroupMemoryUsage(pod *v1.Pod) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noteUsage(pod)
	return p.usage[pod.UID], nil
}

func (p *podCgroups) GetPodCgroupConfig(pod *v1.Pod, _ v1.ResourceName) (*cm.ResourceConfig, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return copyConfig(p.record(pod)), nil
}
