// Package wire is the protocol between host agents (internal/agent) and
// controllers (internal/fleet): the paths and JSON bodies of the agent API,
// served over HTTPS on the controller's agent port.
//
// An agent enrols once with a one-time token and from then on sends its
// credential as "Authorization: Bearer <credential>". It registers the hosts
// it presents, heartbeats their health and its VMs' power states, long-polls
// for ops (saying which ones it already holds, so that only new ones come
// back and a lost response is simply delivered again) and posts their
// results, which the controller records at most once.
package wire

import (
	"encoding/json"

	"nimbus/internal/driver"
)

// The agent API's paths.
const (
	PathEnrol     = "/v1/agent/enrol"
	PathHosts     = "/v1/agent/hosts"
	PathHeartbeat = "/v1/agent/heartbeat"
	PathPoll      = "/v1/agent/ops/poll"
	PathResults   = "/v1/agent/ops/results"
	PathStop      = "/v1/agent/stop"
	// PathImages + an image id: GET reads the image's data, PUT stores a
	// snapshot's (with ?disk_format=), streamed, not JSON. GET with
	// QueryDirect answers where the host reads the data itself (a
	// driver.ImageDirect, JSON), or 204 when it cannot.
	PathImages = "/v1/agent/images/"
	// QueryDirect asks GET PathImages for the image's ImageDirect.
	QueryDirect = "direct=rbd"
)

// HeaderDiskFormat carries an image's disk format with its data.
const HeaderDiskFormat = "X-Image-Disk-Format"

// The protocol's version. An agent names the version it speaks on every
// request (HeaderProtocol; an agent that names none speaks version 1,
// which it was before versions were named). A controller serves agents
// from MinProtocol to Protocol and names both on every answer, so that
// one release's controllers serve the previous release's agents: an
// operator upgrades the controllers first, then the agents. An agent too
// old is refused with 426 and CodeUpgrade; one newer than its controller
// with 400 and CodeUpgrade too (upgrade the controllers first).
const (
	Protocol          = 1
	MinProtocol       = 1
	HeaderProtocol    = "Nimbus-Agent-Protocol"
	HeaderMinProtocol = "Nimbus-Agent-Protocol-Min"
)

// Op kinds: one per per-server driver call.
const (
	KindSpawn    = "spawn"
	KindDestroy  = "destroy"
	KindPowerOff = "power_off"
	KindPowerOn  = "power_on"
	KindReboot   = "reboot"
	KindPause    = "pause"
	KindUnpause  = "unpause"
	KindSuspend  = "suspend"
	KindResume   = "resume"
	KindResize   = "resize"
	KindConfirm  = "confirm_resize"
	KindSnapshot = "snapshot"
	KindConsole  = "console"
	KindAccess   = "access"
	KindVNC      = "vnc"
	// KindAttachPort and KindDetachPort hot-plug a NIC (PortArgs).
	KindAttachPort = "attach_port"
	KindDetachPort = "detach_port"
	// KindAttachVolume, KindDetachVolume and KindExtendVolume hot-plug
	// and grow a volume's disk (VolumeArgs).
	KindAttachVolume = "attach_volume"
	KindDetachVolume = "detach_volume"
	KindExtendVolume = "extend_volume"
	// KindCopyVolume copies a volume's disk live into a file on the
	// server's host (VolumeArgs: VolumeID, Target).
	KindCopyVolume = "copy_volume"
	// KindSwapVolume moves a server's disk from volume VolumeID onto
	// Volume, live (VolumeArgs).
	KindSwapVolume = "swap_volume"
)

// Error codes, in error bodies and in op results.
const (
	CodeUpgrade      = "upgrade_required" // the agent's and controller's protocols do not meet
	CodeBadRequest   = "bad_request"
	CodeUnauthorized = "unauthorized"
	CodeNotFound     = "not_found" // an API object, or (in a result) driver.ErrNotFound
	CodeConflict     = "conflict"
	CodeForbidden    = "forbidden"
	CodeTooLarge     = "too_large"
	CodeMethod       = "method_not_allowed"
	CodeInternal     = "internal"
	CodeUnavailable  = "unavailable" // the controller's database is away: try again after Retry-After
	CodeHostDown     = "host_down"   // in a result: driver.ErrHostDown
	CodeNoConsole    = "no_console"  // in a result: driver.ErrNoConsole
	CodeNotRunning   = "not_running" // in a result: driver.ErrNotRunning
	CodeFailed       = "failed"      // in a result: any other driver error
)

// Error is what went wrong.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorBody is every error response: {"error": {"code", "message"}}.
type ErrorBody struct {
	Error Error `json:"error"`
}

// EnrolRequest trades a one-time token for a credential. Name is how the
// operator will see the agent (its host name by default).
type EnrolRequest struct {
	Token string `json:"token"`
	Name  string `json:"name"`
}

// EnrolResponse is the agent's identity: Credential is shown once.
type EnrolResponse struct {
	AgentID    string `json:"agent_id"`
	Credential string `json:"credential"`
}

// HostsRequest registers (or updates) the hosts an agent presents, with
// their inventory. Hosts it presented before and leaves out are no longer
// its own.
type HostsRequest struct {
	Hosts []driver.Host `json:"hosts"`
}

// HostsResponse says which hosts are now the agent's. A host that another
// agent presents and that is still up is refused (two agents must not
// drive one hypervisor); the agent may try again later.
type HostsResponse struct {
	Registered []string  `json:"registered"`
	Refused    []Refusal `json:"refused,omitempty"`
}

// Refusal is a host not registered, and why.
type Refusal struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// HostStatus is one host's health in a heartbeat.
type HostStatus struct {
	Name   string `json:"name"`
	Up     bool   `json:"up"`
	Health string `json:"health,omitempty"`
}

// Instance is one VM in a heartbeat.
type Instance struct {
	ID    string            `json:"id"`
	Host  string            `json:"host"`
	Power driver.PowerState `json:"power_state"`
}

// Heartbeat says the agent is alive, how its hosts are, and every VM it has
// with its power state. Observed is the agent's clock (unix ns) when it
// looked: a report older than what the controller holds changes nothing.
type Heartbeat struct {
	Observed  int64        `json:"observed"`
	Hosts     []HostStatus `json:"hosts"`
	Instances []Instance   `json:"instances"`
}

// StopRequest says the agent is stopping cleanly: its hosts are down at
// once. Observed is the agent's clock (unix ns), as in Heartbeat.
type StopRequest struct {
	Observed int64 `json:"observed"`
}

// StopResponse lists the hosts marked down.
type StopResponse struct {
	Hosts []string `json:"hosts"`
}

// HeartbeatResponse tells the agent the controller's settings and the
// hosts it holds as the agent's: one missing calls for registering again.
type HeartbeatResponse struct {
	DownAfterSeconds float64  `json:"down_after_seconds"`
	Hosts            []string `json:"hosts"`
}

// PollRequest asks for ops. Have lists the ops the agent holds (running,
// or finished with the result not yet accepted), which are not sent again;
// WaitMS is how long to wait for one (the controller caps it).
type PollRequest struct {
	Have   []string `json:"have"`
	WaitMS int      `json:"wait_ms"`
}

// Op is one piece of work for a server on one of the agent's hosts, in the
// order the controller made them.
type Op struct {
	ID       string          `json:"id"`
	Key      string          `json:"key"`
	Host     string          `json:"host"`
	ServerID string          `json:"server_id"`
	Kind     string          `json:"kind"`
	Args     json.RawMessage `json:"args,omitempty"`
}

// PollResponse is the ops not in Have; empty when none came in time.
type PollResponse struct {
	Ops []Op `json:"ops"`
}

// Result is how an op ended. Power is the server's power state right after
// (absent when unknown), observed at Observed (the agent's clock, unix ns).
type Result struct {
	OpID     string             `json:"op_id"`
	OK       bool               `json:"ok"`
	Error    *Error             `json:"error,omitempty"`
	Result   json.RawMessage    `json:"result,omitempty"`
	Power    *driver.PowerState `json:"power_state,omitempty"`
	Observed int64              `json:"observed"`
}

// ResultsRequest posts finished ops; posting one again is harmless.
type ResultsRequest struct {
	Results []Result `json:"results"`
}

// ResultsResponse lists the op ids the agent may forget: recorded now or
// before, or unknown to the controller (expired, or not its own).
type ResultsResponse struct {
	Done []string `json:"done"`
}

// Op arguments and results, by kind. Spawn and resize take a driver.Spec.

// PowerOffArgs are a power_off's arguments.
type PowerOffArgs struct {
	Graceful bool `json:"graceful"`
}

// RebootArgs are a reboot's arguments.
type RebootArgs struct {
	Hard bool `json:"hard"`
}

// ConsoleArgs are a console read's arguments.
type ConsoleArgs struct {
	Lines int `json:"lines"`
}

// SnapshotArgs are a snapshot's arguments: the image that receives the disk.
type SnapshotArgs struct {
	ImageID string `json:"image_id"`
}

// PortArgs are an attach_port's (Port) or a detach_port's (PortID)
// arguments.
type PortArgs struct {
	Port   driver.Port `json:"port,omitzero"`
	PortID string      `json:"port_id,omitempty"`
}

// VolumeArgs are a volume op's arguments: the volume to attach, or the
// id of one to detach, extend (to SizeBytes) or copy (into Target, a
// file on the server's host), or both for a swap (from VolumeID onto
// Volume).
type VolumeArgs struct {
	Volume    driver.Volume `json:"volume,omitzero"`
	VolumeID  string        `json:"volume_id,omitempty"`
	SizeBytes int64         `json:"size_bytes,omitempty"`
	Target    string        `json:"target,omitempty"`
}

// VNCResult is a console endpoint query's result.
type VNCResult struct {
	Endpoint driver.ConsoleEndpoint `json:"endpoint"`
}

// AccessResult is an access query's result.
type AccessResult struct {
	Access []driver.Access `json:"access"`
}

// SnapshotResult is a snapshot's result.
type SnapshotResult struct {
	SizeBytes int64 `json:"size_bytes"`
}

// ConsoleResult is a console read's result.
type ConsoleResult struct {
	Output string `json:"output"`
}

// The data plane's calls (agents run with --network-mode bridged).
const (
	// PathNetState: POST NetStateRequest, long-polls for the host's
	// desired network state (netstate.Host) newer than After.
	PathNetState = "/v1/agent/netstate"
	// PathMetadata: POST MetadataRequest, the metadata service's answer
	// for the server behind a guest's request to 169.254.169.254.
	PathMetadata = "/v1/agent/metadata"
)

// NetStateRequest asks for Host's network state once its revision is
// above After (at once when it already is, else when it changes or the
// wait ends, whichever is first; the answer is the current state either
// way).
type NetStateRequest struct {
	Host  string `json:"host"`
	After int64  `json:"after"`
}

// MetadataRequest is one guest request the agent's metadata proxy took
// on a tenant network: the server is the one whose port on NetworkID
// has fixed IP SourceIP, as Neutron's metadata proxy identifies it, and
// the controller answers only when that server runs on the agent's Host.
type MetadataRequest struct {
	Host      string `json:"host"`
	NetworkID string `json:"network_id"`
	SourceIP  string `json:"source_ip"`
	Method    string `json:"method"` // GET, HEAD or POST (a Windows password)
	Path      string `json:"path"`   // e.g. /openstack/latest/meta_data.json
	Body      []byte `json:"body,omitempty"`
}

// MetadataResponse is the metadata service's answer, relayed to the guest
// as it is.
type MetadataResponse struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	Body        []byte `json:"body"`
}
