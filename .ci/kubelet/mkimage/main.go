// Command mkimage writes a single-layer container image, as an OCI image
// layout in a tar archive, from a root filesystem directory. The kubelet
// end-to-end tests cannot pull from any registry, so build.sh makes their
// two images with it (fusiond.test/busybox:1 and fusiond.test/pause:1) and
// the test harness loads them with `ctr -n k8s.io images import`.
//
//	mkimage -rootfs DIR -name fusiond.test/busybox:1 -out busybox.tar \
//	    [-entrypoint ARG]... [-env K=V]... [-- CMD ARG...]
//
// The archive holds oci-layout, index.json (one linux/amd64 manifest whose
// annotations name the image), and blobs/sha256/ with the manifest, the
// image config and one gzip layer. The layer is reproducible: entries are
// sorted, owned by root and dated at the Unix epoch, so the same rootfs
// always gives the same image digest.
//
// The name is written to two annotations: org.opencontainers.image.ref.name
// (the OCI one) and io.containerd.image.name, which containerd's importer
// takes as the image name verbatim whatever ctr's prefix options are.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// multiFlag collects a repeated string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// blob is one content-addressed file of the layout.
type blob struct {
	digest string
	data   []byte
}

func newBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), data: data}
}

func main() {
	var entrypoint, env multiFlag
	rootfs := flag.String("rootfs", "", "root filesystem `directory` of the image (required)")
	name := flag.String("name", "", "image `reference`, e.g. fusiond.test/busybox:1 (required)")
	out := flag.String("out", "", "archive `file` to write (required)")
	workdir := flag.String("workdir", "/", "working `directory` of the image's processes")
	flag.Var(&entrypoint, "entrypoint", "one entrypoint argument (repeat for more)")
	flag.Var(&env, "env", "one `K=V` of the image's environment (repeat for more)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: mkimage -rootfs DIR -name REF -out FILE [-entrypoint ARG]... [-env K=V]... [-- CMD ARG...]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *rootfs == "" || *name == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*rootfs, *name, *out, *workdir, entrypoint, env, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(rootfs, name, out, workdir string, entrypoint, env, cmd []string) error {
	layerTar, err := tarDir(rootfs)
	if err != nil {
		return err
	}
	diffID := sha256.Sum256(layerTar)
	layer := newBlob(gzipBytes(layerTar))

	if len(env) == 0 {
		env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	// The image configuration (OCI image-spec config.md); epoch dates keep
	// the digest stable across builds.
	epoch := time.Unix(0, 0).UTC()
	config, err := json.Marshal(map[string]any{
		"created":      epoch,
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env":        env,
			"Entrypoint": nonNil(entrypoint),
			"Cmd":        nonNil(cmd),
			"WorkingDir": workdir,
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])},
		},
		"history": []map[string]any{{"created": epoch, "created_by": "fusiond .ci/kubelet/mkimage"}},
	})
	if err != nil {
		return err
	}
	configBlob := newBlob(config)

	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeManifest,
		"config":        descriptor{MediaType: mediaTypeConfig, Digest: configBlob.digest, Size: int64(len(configBlob.data))},
		"layers":        []descriptor{{MediaType: mediaTypeLayer, Digest: layer.digest, Size: int64(len(layer.data))}},
	})
	if err != nil {
		return err
	}
	manifestBlob := newBlob(manifest)

	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaTypeIndex,
		"manifests": []descriptor{{
			MediaType: mediaTypeManifest,
			Digest:    manifestBlob.digest,
			Size:      int64(len(manifestBlob.data)),
			Platform:  &platform{Architecture: runtime.GOARCH, OS: "linux"},
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": name,
				"io.containerd.image.name":          name,
			},
		}},
	})
	if err != nil {
		return err
	}

	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
	}
	for _, b := range []blob{layer, configBlob, manifestBlob} {
		files = append(files, struct {
			name string
			data []byte
		}{"blobs/sha256/" + strings.TrimPrefix(b.digest, "sha256:"), b.data})
	}

	// Written to a temporary file and renamed, so a killed build never
	// leaves a truncated archive behind under the final name.
	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, f := range files {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// tarDir returns the uncompressed layer: every entry under dir (directories,
// regular files, symbolic links), sorted by path, owned by root.
func tarDir(dir string) ([]byte, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return nil, err
		}
		rel = filepath.ToSlash(rel)
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return nil, err
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil, fmt.Errorf("%s: only directories, regular files and symbolic links go into an image", p)
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil, err
		}
		hdr.Name = rel
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return nil, err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func gzipBytes(data []byte) []byte {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zw.Write(data)
	zw.Close()
	return buf.Bytes()
}

// nonNil keeps an empty list out of the config as null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
