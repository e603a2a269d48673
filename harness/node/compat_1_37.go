//go:build !kube1_33 && !kube1_34 && !kube1_35 && !kube1_36

// What differs between Kubernetes versions, for v1.37 (the default build). The build script
// builds an older version with the tag kube1_<minor>, which picks its compat_1_<minor>.go
// instead: cadvisor's types, the PodContainerManager methods that take a klog.Logger, the
// arguments of cm.ResourceConfigForPod, how the CRI client is made, the protobuf library of
// the CRI types, and whether the prober manager's UpdatePodStatus takes a context (from
// v1.35) differ; nothing else in this package does.

package main

import (
	"context"
	"math"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm"
)

func (c *fakeCadvisor) MachineInfo(logger klog.Logger) (*cadvisorapi.MachineInfo, error) {
	info, err := c.Fake.MachineInfo(logger)
	if err != nil {
		return nil, err
	}
	info.NumCores = c.machine.cores
	info.MemoryCapacity = uint64(c.machine.memory)
	return info, nil
}

func (c *fakeCadvisor) ContainerInfoV2(name string, options cadvisorapi.RequestOptions) (map[string]cadvisorapi.ContainerInfo, error) {
	if !c.pods.knownCgroup(name) {
		return c.Fake.ContainerInfoV2(name, options)
	}
	now := time.Now()
	usage := c.pods.usageOf(name)
	return map[string]cadvisorapi.ContainerInfo{
		name: {
			Spec: cadvisorapi.ContainerSpec{
				CreationTime: now,
				HasCpu:       true,
				HasMemory:    true,
				Memory:       cadvisorapi.MemorySpec{Limit: math.MaxUint64},
			},
			Stats: []*cadvisorapi.ContainerStats{{
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

func (p *podCgroups) GetAllPodsFromCgroups(klog.Logger) (map[types.UID]cm.CgroupName, error) {
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
	return remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).
		WithConnectionTimeout(15 * time.Second).
		Build(ctx)
}

func cloneLinuxResources(r *runtimeapi.LinuxContainerResources) *runtimeapi.LinuxContainerResources {
	return proto.Clone(r).(*runtimeapi.LinuxContainerResources)
}

func (probeManager) UpdatePodStatus(_ context.Context, pod *v1.Pod, status *v1.PodStatus) {
	reportProbed(pod, status)
}
