package saga

import "testing"

func TestMappedMessageNamesTheVolumeOnlyWhenGiven(t *testing.T) {
	for _, c := range []struct{ volume, want string }{
		// the drop-in rbd's maps: ceph-csi's rbd map carries no volume id
		{"", `mapped rbd/k8s1 as /dev/rbd0 (epoch 1, client 203.0.113.11:0/803978335, requester "rbd (rbd-owner drop-in)")`},
		{"pvc-1", `mapped rbd/k8s1 as /dev/rbd0 (epoch 1, client 203.0.113.11:0/803978335, requester "rbd (rbd-owner drop-in)", volume "pvc-1")`},
	} {
		got := mappedMessage("rbd/k8s1", "/dev/rbd0", 1, "203.0.113.11:0/803978335", "rbd (rbd-owner drop-in)", c.volume)
		if got != c.want {
			t.Errorf("volume %q:\n got %s\nwant %s", c.volume, got, c.want)
		}
	}
}
