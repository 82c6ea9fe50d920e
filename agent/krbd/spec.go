package krbd

import "github.com/rbd-owner/rbd-owner/agent/image"

// Spec names an RBD image (or one of its snapshots) to map: the agent's one image reference.
type Spec = image.Ref

// MaxNameLen bounds each name of a Spec (bytes).
const MaxNameLen = image.MaxNameLen

// ParseSpec parses POOL[/NAMESPACE]/IMAGE[@SNAP] and validates every part (see image.Ref.Validate).
func ParseSpec(s string) (Spec, error) { return image.Parse(s) }
