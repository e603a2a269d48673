//go:build kube1_34

// v1.34: as v1.35, and no PodContainerManager method takes a logger (see compat_1_37.go
// for the list).

package main

import (
	"context"
	"math"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	cadvisorapiv2 "github.com/google/cadvisor/info/v2"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm"
)

func (c *fakeCadvisor) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	info, err := c.Fake.MachineInfo()
	if err != nil {
		return nil, err
	}
	info.NumCores = c.machine.cores
	info.MemoryCapacity = uint64(c.machine.memory)
	return info, nil
}

func (c *fakeCadvisor) ContainerInfoV2(name string, options cadvisorapiv2.RequestOptions) (map[string]cadvisorapiv2.ContainerInfo, error) {
	if !c.pods.knownCgroup(name) {
		return c.Fake.ContainerInfoV2(name, options)
	}
	now := time.Now()
	usage := c.pods.usageOf(name)
	return map[string]cadvisorapiv2.ContainerInfo{
		name: {
			Spec: cadvisorapiv2.ContainerSpec{
				CreationTime: now,
				HasCpu:       true,
				HasMemory:    true,
				Memory:       cadvisorapiv2.MemorySpec{Limit: math.MaxUint64},
			},
			Stats: []*cadvisorapiv2.ContainerStats{{
				Timestamp: now,
				Memory:    &cadvisorapi.MemoryStats{Usage: usage, WorkingSet: usage},
			}},
		},
	}, nil
}

func (p *podCgroups) EnsureExists(pod *v1.Pod) error {
	p.ensure(pod)
	return nil
}

func (p *podCgroups) Destroy(cm.CgroupName) error { return nil }

func (p *podCgroups) ReduceCPULimits(cm.CgroupName) error { return nil }

func (p *podCgroups) GetAllPodsFromCgroups() (map[types.UID]cm.CgroupName, error) {
	return nil, nil
}

func (p *podCgroups) SetPodCgroupConfig(pod *v1.Pod, config *cm.ResourceConfig) error {
	p.set(pod, config)
	return nil
}

// GetNodeAllocatableAbsolute is what the allocation manager of 1.34 and 1.35 checks a
// resize's feasibility against (read at every check); the stub answers nothing,
// which would make every resize that adds CPU or memory Infeasible.
func (m *containerManager) GetNodeAllocatableAbsolute() v1.ResourceList {
	return m.allocatableAbsolute()
}

// resourceConfigForPod is what the kubelet writes into a pod's cgroup (CPU limits enforced,
// no memory QoS).
func resourceConfigForPod(pod *v1.Pod) *cm.ResourceConfig {
	return cm.ResourceConfigForPod(pod, true, cpuPeriod, false)
}

func newRuntimeClient(ctx context.Context, endpoint string) (internalapi.RuntimeService, error) {
	logger := klog.FromContext(ctx)
	return remote.NewRemoteRuntimeService(endpoint, 15*time.Second, noop.NewTracerProvider(), &logger)
}

func cloneLinuxResources(r *runtimeapi.LinuxContainerResources) *runtimeapi.LinuxContainerResources {
	return proto.Clone(r).(*runtimeapi.LinuxContainerResources)
}

func (probeManager) UpdatePodStatus(pod *v1.Pod, status *v1.PodStatus) {
	reportProbed(pod, status)
}
