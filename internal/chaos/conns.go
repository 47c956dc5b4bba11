package chaos

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// Which process opened a TCP connection the scripted Gitea accepted, found
// from the kernel's own tables (no header or other help from the product):
// the connection's client end is a socket in the client process, listed in
// /proc/net/tcp under its local and remote address with its inode, and the
// process holds it as a file descriptor linking to "socket:[inode]". The
// client's socket exists before it connects, so while the client lives the
// lookup at accept time finds it; a client already dead by then is unknown
// (0), which no verdict counts in its favour.

// socketInode returns the inode of the TCP socket whose local end is local
// and remote end remote, as /proc/net/tcp (or tcp6) lists it.
func socketInode(local, remote netip.AddrPort) (uint64, error) {
	local, remote = netip.AddrPortFrom(local.Addr().Unmap(), local.Port()), netip.AddrPortFrom(remote.Addr().Unmap(), remote.Port())
	table := "/proc/net/tcp"
	if local.Addr().Is6() {
		table = "/proc/net/tcp6"
	}
	f, err := os.Open(table)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Scan() // the header
	for s.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
		fields := strings.Fields(s.Text())
		if len(fields) < 10 {
			continue
		}
		l, err1 := parseProcAddr(fields[1])
		r, err2 := parseProcAddr(fields[2])
		if err1 != nil || err2 != nil || l != local || r != remote {
			continue
		}
		return strconv.ParseUint(fields[9], 10, 64)
	}
	if err := s.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no socket %s -> %s in %s", local, remote, table)
}

// parseProcAddr parses an address of /proc/net/tcp: the IP as 32-bit words
// in hex, each in the host's byte order, a colon, the port in hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	raw, err := hex.DecodeString(ipHex)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	for i := 0; i < len(raw); i += 4 { // each word as the host stores it
		binary.BigEndian.PutUint32(raw[i:], binary.NativeEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	ip, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(ip.Unmap(), uint16(port)), nil
}

// holder returns which of pids holds the socket inode as a file
// descriptor, 0 if none does.
func holder(inode uint64, pids []int) int {
	link := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // ended meanwhile
		}
		for _, e := range entries {
			if l, err := os.Readlink(dir + e.Name()); err == nil && l == link {
				return pid
			}
		}
	}
	return 0
}

// connOwner returns which of pids opened the connection whose client end is
// client and server end server (as the server sees them: RemoteAddr,
// LocalAddr), 0 if none can be found.
func connOwner(client, server net.Addr, pids []int) int {
	c, err1 := netip.ParseAddrPort(client.String())
	s, err2 := netip.ParseAddrPort(server.String())
	if err1 != nil || err2 != nil {
		return 0
	}
	inode, err := socketInode(c, s)
	if err != nil {
		return 0
	}
	return holder(inode, pids)
}
