package claim

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rbd-owner/rbd-owner/agent/claim/memory"
)

// A claim's image is checked by image.Ref.Validate, the agent's one check of image names, and
// a snapshot is refused: each refusal is ErrInvalid, says so once and names what is wrong.
func TestClaimImageIsValidatedByImageRef(t *testing.T) {
	ctx := context.Background()
	m := memory.New("fsid")
	s := memNode(t, m, "node-a", newClock())
	for _, c := range []struct {
		img  Image
		want string
	}{
		{Image{Image: "x"}, "pool: empty"},
		{Image{Pool: "rbd"}, "image: empty"},
		{Image{Pool: "rbd", Image: "a,b"}, `image "a,b": character ','`},
		{Image{Pool: "rbd", Namespace: "..", Image: "x"}, `namespace "..": not usable as a path component`},
		{Image{Pool: "rbd", Image: "x", Snap: "s1"}, `a claim is for an image, not snapshot "s1"`},
	} {
		_, err := s.Acquire(ctx, Request{Image: c.img})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) || strings.Count(err.Error(), ErrInvalid.Error()) != 1 {
			t.Errorf("acquire %+v: %v; want ErrInvalid once, naming %q", c.img, err, c.want)
		}
		if _, err := s.Inspect(ctx, c.img); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("inspect %+v: %v; want ErrInvalid naming %q", c.img, err, c.want)
		}
	}
}
