//go:build kube1_36

// v1.36: cadvisor's info/v1 and info/v2 types, MachineInfo without a logger,
// GetAllPodsFromCgroups without a logger, the CRI client from NewRemoteRuntimeService (see
// compat_1_37.go for the list).

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

func (p *podCgroups) EnsureExists(_ klog.Logger, pod *v1.Pod) error {
	p.ensure(pod)
	return nil
}

func (p *podCgroups) Destroy(klog.Logger, cm.CgroupName) error { return nil }

func (p *podCgroups) ReduceCPULimits(klog.Logger, cm.CgroupName) error { return nil }

func (p *podCgroups) GetAllPodsFromCgroups() (map[types.UID]cm.CgroupName, error) {
	return nil, nil
}

func (p *podCgroups) SetPodCgroupConfig(_ klog.Logger, pod *v1.Pod, config *cm.ResourceConfig) error {
	p.set(pod, config)
	return nil
}

// resourceConfigForPod is what the kubelet writes into a pod's cgroup (CPU limits enforced,
// no memory QoS).
func resourceConfigForPod(pod *v1.Pod) *cm.ResourceConfig {
	return cm.ResourceConfigForPod(pod, true, cpuPeriod, false, "")
}

func newRuntimeClient(ctx context.Context, endpoint string) (internalapi.RuntimeService, error) {
	return remote.NewRemoteRuntimeService(ctx, endpoint, 15*time.Second, noop.NewTracerProvider(), false)
}

func cloneLinuxResources(r *runtimeapi.LinuxContainerResources) *runtimeapi.LinuxContainerResources {
	return proto.Clone(r).(*runtimeapi.LinuxContainerResources)
}

func (probeManager) UpdatePodStatus(_ context.Context, pod *v1.Pod, status *v1.PodStatus) {
	reportProbed(pod, status)
}
