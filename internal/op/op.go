// Package op names the container runtime's operations: the op a
// cruntime.CallTracer is told, the values of the operation_type label of
// pleg's metrics, and each one's CRI method. It is their one definition,
// a leaf that cruntime and metrics both use without either importing the
// other.
package op

// Runtime operation types.
const (
	ListPodSandbox     = "list_podsandbox"
	ListContainers     = "list_containers"
	PodSandboxStatus   = "podsandbox_status"
	ContainerStatus    = "container_status"
	GetContainerEvents = "get_container_events"
	Status             = "status"
	Version            = "version"
)

// methods maps each operation type to its CRI method: the one table of it.
var methods = map[string]string{
	ListPodSandbox:     "ListPodSandbox",
	ListContainers:     "ListContainers",
	PodSandboxStatus:   "PodSandboxStatus",
	ContainerStatus:    "ContainerStatus",
	GetContainerEvents: "GetContainerEvents",
	Status:             "Status",
	Version:            "Version",
}

// Method returns the CRI method of an operation type (the operation_type
// label), e.g. "ContainerStatus" for "container_status"; an unknown
// operation type is returned as is.
func Method(op string) string {
	if m, ok := methods[op]; ok {
		return m
	}
	return op
}
