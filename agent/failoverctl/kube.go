package failoverctl

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/rbd-owner/rbd-owner/agent/claim"
	"github.com/rbd-owner/rbd-owner/agent/claim/record"
	"github.com/rbd-owner/rbd-owner/agent/failover"
)

// wholeAddr says whether a fence's address is a node's whole address (ip:0/0).
func wholeAddr(addr string) bool {
	a := record.BareAddr(addr)
	ip, ok := record.AddrIP(a)
	return ok && record.WholeIP(ip) == a
}

func hasTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == OutOfService {
			return true
		}
	}
	return false
}

// setTaint adds (on) or removes the out-of-service taint in m.
func setTaint(m *corev1.Node, on bool, now time.Time) {
	if hasTaint(m) == on {
		return
	}
	if on {
		m.Spec.Taints = append(m.Spec.Taints, corev1.Taint{Key: OutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute, TimeAdded: &metav1.Time{Time: now}})
		return
	}
	var keep []corev1.Taint
	for _, t := range m.Spec.Taints {
		if t.Key != OutOfService {
			keep = append(keep, t)
		}
	}
	m.Spec.Taints = keep
}

// heldVolumes are the names of the PersistentVolumes of this controller's CSI driver whose
// image is in held (image refs as claim.Image.String gives them).
func (c *Controller) heldVolumes(ctx context.Context, held map[string]bool) (map[string]bool, error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	pvs, err := c.kube.CoreV1().PersistentVolumes().List(cctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the persistent volumes: %w", err)
	}
	out := map[string]bool{}
	for _, pv := range pvs.Items {
		if img, ok := ImageOf(&pv, c.cfg.Driver); ok && held[img.String()] {
			out[pv.Name] = true
		}
	}
	return out, nil
}

// ImageOf is the RBD image of a PersistentVolume of the CSI driver (ceph-csi's volume context:
// pool, radosNamespace, and imageName, or for a static volume the volume handle).
func ImageOf(pv *corev1.PersistentVolume, driver string) (claim.Image, bool) {
	src := pv.Spec.CSI
	if src == nil || src.Driver != driver {
		return claim.Image{}, false
	}
	a := src.VolumeAttributes
	img := claim.Image{Pool: a["pool"], Namespace: a["radosNamespace"], Image: a["imageName"]}
	if a["staticVolume"] == "true" {
		img.Image = src.VolumeHandle
	}
	return img, img.Pool != "" && img.Image != ""
}

// deletePods force-deletes the pods on n that use one of pvs, unless they opt out; it returns
// the volumes an opted-out pod uses (their attachments stay).
func (c *Controller) deletePods(ctx context.Context, n *corev1.Node, pvs map[string]bool) (map[string]bool, error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	pods, err := c.kube.CoreV1().Pods(metav1.NamespaceAll).List(cctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", n.Name).String()})
	if err != nil {
		return nil, fmt.Errorf("list the pods on node %s: %w", n.Name, err)
	}
	keep := map[string]bool{}
	zero := int64(0)
	for _, p := range pods.Items {
		if p.Spec.NodeName != n.Name {
			continue
		}
		uses, err := c.podVolumes(cctx, &p, pvs)
		if err != nil {
			return nil, err
		}
		if len(uses) == 0 {
			continue
		}
		if p.Annotations[failover.OptOut] == "true" {
			for _, v := range uses {
				keep[v] = true
			}
			c.event(n, corev1.EventTypeWarning, "FailoverPodKept", "pod %s/%s opts out (%s): not deleted; its volumes stay attached to %s", p.Namespace, p.Name, failover.OptOut, n.Name)
			continue
		}
		err = c.kube.CoreV1().Pods(p.Namespace).Delete(cctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("force-delete pod %s/%s on node %s: %w", p.Namespace, p.Name, n.Name, err)
		}
		c.event(n, corev1.EventTypeWarning, "FailoverPodDeleted", "pod %s/%s force-deleted: it used %v, held by %s and fenced", p.Namespace, p.Name, uses, n.Name)
		c.cfg.Log.WithField("node", n.Name).WithField("pod", p.Namespace+"/"+p.Name).Warn("failover: pod force-deleted")
	}
	return keep, nil
}

// podVolumes are the persistent volumes of pvs that pod p uses through its claims.
func (c *Controller) podVolumes(ctx context.Context, p *corev1.Pod, pvs map[string]bool) ([]string, error) {
	var out []string
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		pvc, err := c.kube.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx, v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read claim %s/%s of pod %s: %w", p.Namespace, v.PersistentVolumeClaim.ClaimName, p.Name, err)
		}
		if pvs[pvc.Spec.VolumeName] {
			out = append(out, pvc.Spec.VolumeName)
		}
	}
	return out, nil
}

// deleteAttachments deletes the VolumeAttachments of pvs to n (but those in keep), so that the
// volume attaches to the pod's new node at once.
func (c *Controller) deleteAttachments(ctx context.Context, n *corev1.Node, pvs, keep map[string]bool) error {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	vas, err := c.kube.StorageV1().VolumeAttachments().List(cctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the volume attachments: %w", err)
	}
	for _, va := range vas.Items {
		pv := va.Spec.Source.PersistentVolumeName
		if va.Spec.NodeName != n.Name || pv == nil || !pvs[*pv] || keep[*pv] || va.Spec.Attacher != c.cfg.Driver {
			continue
		}
		err := c.kube.StorageV1().VolumeAttachments().Delete(cctx, va.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &va.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete volume attachment %s (%s on node %s): %w", va.Name, *pv, n.Name, err)
		}
		c.event(n, corev1.EventTypeWarning, "FailoverDetached", "volume attachment %s of %s deleted: %s is fenced", va.Name, *pv, n.Name)
	}
	return nil
}
