package cli

import (
	"slices"
	"testing"
)

// TestMountHelper: what mount(8) and fstab give mount.ferry becomes the
// ferry mount command line; what fstab means for itself is dropped, and a
// typo is refused unless mount was told to be sloppy.
func TestMountHelper(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []string
		want []string // nil: an error.
		home string
		run  bool
	}{
		{"plain", []string{"h:/src", "/mnt"}, []string{"mount", "h:/src", "/mnt"}, "", true},
		{"fstab line", []string{"h:/src", "/mnt", "-o", "rw,_netdev,noauto,nofail,x-systemd.automount,allow_other,timeout=30s,memory=128M,writeback,home=/etc/ferry"},
			[]string{"mount", "--timeout=30s", "--memory=128M", "--writeback", "-o", "rw,allow_other", "h:/src", "/mnt"}, "/etc/ferry", true},
		{"flags mount passes", []string{"h:7000:/", "/mnt", "-n", "-v", "-t", "ferry", "-o", "ro,nosuid,nodev,uid=1000,gid=100"}, []string{"mount", "-o", "ro,uid=1000,gid=100", "h:7000:/", "/mnt"}, "", true},
		{"fake", []string{"-f", "h:/", "/mnt"}, []string{"mount", "h:/", "/mnt"}, "", false},
		{"unknown option", []string{"h:/", "/mnt", "-o", "timout=3s"}, nil, "", false},
		{"sloppy", []string{"-sv", "h:/", "/mnt", "-o", "timout=3s,ro"}, []string{"mount", "-o", "ro", "h:/", "/mnt"}, "", true},
		{"no mount point", []string{"h:/"}, nil, "", false},
		{"-o without options", []string{"h:/", "/mnt", "-o"}, nil, "", false},
		{"unknown flag", []string{"-x", "h:/", "/mnt"}, nil, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, home, run, err := MountHelper(tc.in)
			if tc.want == nil {
				if err == nil {
					t.Errorf("MountHelper(%q) = %q, want an error", tc.in, args)
				}
				return
			}
			if err != nil || !slices.Equal(args, tc.want) || home != tc.home || run != tc.run {
				t.Errorf("MountHelper(%q) = %q, home %q, run %v, %v; want %q, home %q, run %v", tc.in, args, home, run, err, tc.want, tc.home, tc.run)
			}
		})
	}
}
