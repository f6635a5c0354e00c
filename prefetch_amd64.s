#include "textflag.h"

// func prefetchw3(head *linkField, seq *relUint32, val *unsafe.Pointer)
//
// PREFETCHW is 0F 0D /1; the Go assembler has no mnemonic for it, so it is
// written as bytes, with ModRM 0x08, 0x0B and 0x09 for (AX), (BX), (CX).
TEXT ·prefetchw3(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ head+0(FP), AX
	MOVQ seq+8(FP), BX
	MOVQ val+16(FP), CX
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08 // PREFETCHW (AX)
	BYTE $0x0F; BYTE $0x0D; BYTE $0x0B // PREFETCHW (BX)
	BYTE $0x0F; BYTE $0x0D; BYTE $0x09 // PREFETCHW (CX)
	RET

// func prefetch(addrs []unsafe.Pointer, write bool)
//
// With write set, PREFETCHW (ModRM 0x08 for (AX)); else PREFETCHT0.
TEXT ·prefetch4(SB), NOSPLIT|NOFRAME, $0-32
	MOVQ a+0(FP), AX
	MOVQ b+8(FP), BX
	MOVQ c+16(FP), CX
	MOVQ d+24(FP), DX
	PREFETCHT0 (AX)
	PREFETCHT0 (BX)
	PREFETCHT0 (CX)
	PREFETCHT0 (DX)
	RET

TEXT ·prefetch(SB), NOSPLIT|NOFRAME, $0-25
	MOVQ addrs_base+0(FP), SI
	MOVQ addrs_len+8(FP), CX
	MOVBLZX write+24(FP), DX
	TESTQ CX, CX
	JZ done
loop:
	MOVQ (SI), AX
	TESTB DX, DX
	JZ read
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08 // PREFETCHW (AX)
	JMP next
read:
	PREFETCHT0 (AX)
next:
	ADDQ $8, SI
	DECQ CX
	JNZ loop
done:
	RET

// func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT|NOFRAME, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET
