package main

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
)

// runtimeShim is the kubelet's CRI client of the fake runtime, with what the fake leaves out
// and a real runtime does:
//   - a container's Linux resources, as given at creation and by each update, are reported
//     back in its status, as containerd does (the fake reports none, and the kubelet then
//     shows zeroed limits in the pod's status);
//   - StopContainer takes the container's grace period, as a process that ignores SIGTERM
//     would (the fake stops at once), at most stopGraceCap when that is not negative;
//   - a sandbox's resources seed the pod's cgroup record.
type runtimeShim struct {
	internalapi.RuntimeService
	fake         *apitest.FakeRuntimeService
	pods         *podCgroups
	stopGraceCap time.Duration
}

func (r *runtimeShim) RunPodSandbox(ctx context.Context, config *runtimeapi.PodSandboxConfig, runtimeHandler string) (string, error) {
	id, err := r.RuntimeService.RunPodSandbox(ctx, config, runtimeHandler)
	if err != nil {
		return id, err
	}
	res := config.GetLinux().GetResources()
	r.pods.seed(types.UID(config.GetMetadata().GetUid()), res.GetMemoryLimitInBytes(), res.GetCpuQuota(), uint64(res.GetCpuShares()))
	return id, nil
}

func (r *runtimeShim) RemovePodSandbox(ctx context.Context, podSandboxID string) error {
	r.fake.Lock()
	sandbox, ok := r.fake.Sandboxes[podSandboxID]
	var uid types.UID
	if ok {
		uid = types.UID(sandbox.GetMetadata().GetUid())
	}
	r.fake.Unlock()
	if err := r.RuntimeService.RemovePodSandbox(ctx, podSandboxID); err != nil {
		return err
	}
	if ok {
		r.pods.drop(uid)
	}
	return nil
}

func (r *runtimeShim) CreateContainer(ctx context.Context, podSandboxID string, config *runtimeapi.ContainerConfig, sandboxConfig *runtimeapi.PodSandboxConfig) (string, error) {
	id, err := r.RuntimeService.CreateContainer(ctx, podSandboxID, config, sandboxConfig)
	if err != nil {
		return id, err
	}
	r.recordResources(id, config.GetLinux().GetResources())
	return id, nil
}

func (r *runtimeShim) UpdateContainerResources(ctx context.Context, containerID string, resources *runtimeapi.ContainerResources) error {
	if err := r.RuntimeService.UpdateContainerResources(ctx, containerID, resources); err != nil {
		return err
	}
	r.recordResources(containerID, resources.GetLinux())
	return nil
}

func (r *runtimeShim) recordResources(containerID string, linux *runtimeapi.LinuxContainerResources) {
	if linux == nil {
		return
	}
	r.fake.Lock()
	defer r.fake.Unlock()
	container, ok := r.fake.Containers[containerID]
	if !ok {
		return
	}
	recorded := cloneLinuxResources(linux)
	container.LinuxResources = recorded
	container.Resources = &runtimeapi.ContainerResources{Linux: recorded}
}

func (r *runtimeShim) StopContainer(ctx context.Context, containerID string, timeout int64) error {
	wait := time.Duration(timeout) * time.Second
	if r.stopGraceCap >= 0 && wait > r.stopGraceCap {
		wait = r.stopGraceCap
	}
	if wait > 0 && r.running(containerID) {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
		case <-timer.C:
		}
	}
	return r.RuntimeService.StopContainer(context.WithoutCancel(ctx), containerID, timeout)
}

func (r *runtimeShim) running(containerID string) bool {
	r.fake.Lock()
	defer r.fake.Unlock()
	c, ok := r.fake.Containers[containerID]
	return ok && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING
}
